"""qmesh's CUDA handlers against its CPU handlers, on the same inputs: the FP8 casts bit for
bit (both round to nearest even and saturate the same way), the MXFP8 and NVFP4 casts too
(stochastic rounding, the RHT and a shard's cast at its origin included), the GEMMs and the
dense layer within the tolerances of docs/numerics.md; the MXFP8 / NVFP4 GEMM handler against
the Python emulation. Skipped where JAX sees no GPU (CI); run on a GPU machine by
launch/gpu_check.sh (step jax)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
import test_microscaled_gemm as mgt

import qmesh.jax as qj
from qmesh.jax import dense as qdense
from qmesh.jax import emulation
from qmesh.jax import stats as qstats
from qmesh.jax.activation_quantize import (
    dgelu_dbias_quantize,
    dgelu_dbias_quantize_current,
    gelu_quantize,
    gelu_quantize_current,
)
from qmesh.jax.gemm import Epilogue, gemm
from qmesh.jax.layer_norm import layer_norm, norm_fwd_amax, norm_fwd_quantize
from qmesh.jax.mlp import mlp
from qmesh.jax.nvfp4 import Nvfp4Amax, Nvfp4Quantize, key_words
from qmesh.jax.recipe import DelayedScaling, Float8BlockScaling, Float8CurrentScaling


def _gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


GPU = _gpu()
CPU = jax.devices("cpu")[0]
pytestmark = pytest.mark.skipif(GPU is None, reason="JAX sees no GPU")

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def on_both(fn, *args):
    """fn(*args) computed on the GPU and on the CPU, as numpy trees."""
    results = []
    for device in (GPU, CPU):
        placed = jax.device_put(args, device)
        results.append(jax.tree.map(np.asarray, jax.jit(fn)(*placed)))
    return results


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


def assert_bitwise(gpu, cpu):
    """Every leaf of two result trees equal bit for bit."""
    for g, c in zip(jax.tree.leaves(gpu), jax.tree.leaves(cpu), strict=True):
        np.testing.assert_array_equal(bits(g), bits(c))


def random(rng, shape, dtype=jnp.float32, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype)


@pytest.mark.parametrize("in_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_quantize_is_bitwise_equal(rng, in_dtype, fp8):
    # Large values too, so that saturation is part of the comparison.
    x = random(rng, (96, 80), in_dtype, scale=100.0)
    gpu, cpu = on_both(lambda x, s: qj.quantize(x, s, fp8, columnwise=True), x, jnp.float32(3.0))
    assert_bitwise(gpu, cpu)


def test_current_scaling_and_amax_are_bitwise_equal(rng):
    x = random(rng, (64, 48), jnp.bfloat16, scale=7.0)
    gpu, cpu = on_both(lambda x: (qj.quantize_current(x, E4M3, columnwise=True), qj.amax(x)), x)
    assert_bitwise(gpu, cpu)


def test_dbias_quantize(rng):
    g = random(rng, (128, 64), jnp.bfloat16)
    (qg, dbg), (qc, dbc) = on_both(
        lambda g, s: qj.dbias_quantize(g, s, E5M2, columnwise=True), g, jnp.float32(2.0)
    )
    assert_bitwise(qg, qc)
    # The row sums differ only in summation order.
    assert ref.rel_err(dbg, dbc) < 1e-5


@pytest.mark.parametrize("in_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("block", [1, 2])
def test_block_quantize_is_bitwise_equal(rng, in_dtype, block):
    """Codes, scales (padding included), the columnwise copy and its scales, and the bias
    gradient (summed in the same fixed order on both backends) bit for bit."""
    x = random(rng, (200, 300), in_dtype, scale=100.0)
    gpu, cpu = on_both(
        lambda x: (
            qj.block_quantize(x, block=block, columnwise=True),
            qj.block_dbias_quantize(x, block=block, columnwise=True),
        ),
        x,
    )
    assert_bitwise(gpu, cpu)


@pytest.mark.parametrize(("in_dtype", "fp8"), [(jnp.float32, E4M3), (jnp.bfloat16, E5M2)])
def test_mxfp8_casts_are_bitwise_equal(rng, in_dtype, fp8):
    """Codes, E8M0 scales, both copies, the bias gradient, the dequantized values; the grouped
    cast (two groups) too."""
    x = random(rng, (96, 128), in_dtype, scale=100.0).at[5, 7].set(jnp.inf)
    gpu, cpu = on_both(
        lambda x: (
            qj.mxfp8_quantize(x, fp8, columnwise=True),
            qj.mxfp8_dbias_quantize(x, fp8, columnwise=True)[0],
            qj.mxfp8_dequantize(*qj.mxfp8_quantize(x, fp8)[:2]),
            qj.grouped_mxfp8_quantize(x, jnp.array([32, 64], jnp.int32), fp8, columnwise=True),
        ),
        x,
    )
    assert_bitwise(gpu, cpu)


NVFP4_CASTS = {  # (input dtype, options)
    "blocks": (jnp.float32, dict()),
    "tiles": (jnp.bfloat16, dict(tiles_2d=True)),
    "sr": (jnp.float32, dict(stochastic_rounding=True)),
    "sr_rht": (jnp.bfloat16, dict(stochastic_rounding=True, rht=True, rht_signs=0x5A3C)),
}


@pytest.mark.parametrize("cast", NVFP4_CASTS)
def test_nvfp4_casts_are_bitwise_equal(rng, cast):
    """Both copies (stochastic rounding from the same key, the RHT), the dequantized values, the
    grouped cast and the amaxes; then a NaN: the NaN decode scale on both."""
    in_dtype, options = NVFP4_CASTS[cast]

    def casts(x, key):
        q = qj.nvfp4_quantize(x, key, columnwise=True, **options)
        groups = jnp.array([32, 64], jnp.int32)
        return (
            q,
            qj.nvfp4_dequantize(*q[:3]),
            qj.grouped_nvfp4_quantize(x, groups, key, **options),
            Nvfp4Amax.bind(x, rht=bool(options.get("rht")), rht_signs=options.get("rht_signs", 0)),
        )

    x = random(rng, (96, 128), in_dtype, scale=30.0)
    key = jax.random.key_data(jax.random.key(7))
    assert_bitwise(*on_both(casts, x, key))
    assert_bitwise(*on_both(casts, x.at[40, 3].set(jnp.nan), key))


def test_nvfp4_shard_cast_at_a_device_origin_is_bitwise_equal(rng):
    """The cast of one shard at its place in a whole tensor (the origin read on the device),
    with given amaxes, as each device of a sharded cast runs it."""
    x = random(rng, (64, 96), jnp.float32, scale=5.0)
    key = jax.random.key_data(jax.random.key(3))
    params = dict(columnwise=True, stochastic_rounding=True, tiles_2d=False, rht=True, rht_signs=3)

    def shard_cast(x, key, amaxes, origin):
        return Nvfp4Quantize.inner.bind(
            x,
            key_words(key),
            amaxes[:1],
            amaxes[1:],
            origin,
            whole_rows=256,
            whole_cols=192,
            **params,
        )

    amaxes = jnp.array([7.5, 9.25], jnp.float32)
    assert_bitwise(*on_both(shard_cast, x, key, amaxes, jnp.array([128, 64], jnp.int32)))


@pytest.mark.parametrize("blocks", [(1, 2), (1, 1)], ids=["1Dx2D", "1Dx1D"])
def test_block_gemm(rng, blocks):
    qa, sa, _, _ = qj.block_quantize(random(rng, (256, 384)), block=blocks[0])
    qb, sb, _, _ = qj.block_quantize(random(rng, (128, 384)), block=blocks[1])
    gpu, cpu = on_both(
        lambda *v: gemm(*v, a_block=blocks[0], b_block=blocks[1], split_accumulator=True),
        qa,
        qb,
        sa,
        sb,
    )
    assert ref.rel_err(gpu, cpu) < 4 * 2.0**-14


def test_dense_with_the_block_recipe(rng):
    x = random(rng, (256, 256), jnp.bfloat16)
    kernel = random(rng, (256, 128), jnp.float32, scale=0.1)
    bias = random(rng, (128,), jnp.float32, scale=0.1)
    recipe = Float8BlockScaling()

    def loss(x, kernel, bias):
        y = qdense.dense(x, kernel, bias, recipe=recipe, activation="gelu")
        return jnp.sum(jnp.square(y.astype(jnp.float32)))

    gpu, cpu = on_both(jax.value_and_grad(loss, argnums=(0, 1, 2)), x, kernel, bias)
    assert ref.rel_err(gpu[0], cpu[0]) < 2e-2
    for name, g, c in zip(("dx", "dkernel", "dbias"), gpu[1], cpu[1]):
        assert ref.rel_err(g, c) < 5e-2, name


@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_fp8_gemm(rng, out_dtype):
    a = qj.quantize(random(rng, (128, 96)), jnp.float32(8.0))
    b = qj.quantize(random(rng, (64, 96)), jnp.float32(16.0))
    gpu, cpu = on_both(
        lambda qa, qb, sa, sb: gemm(
            qa, qb, sa, sb, trans_b=True, out_dtype=out_dtype, split_accumulator=True
        ),
        a.q,
        b.q,
        a.scale_inv,
        b.scale_inv,
    )
    # Hopper's FP8 accumulator keeps about 14 bits between promotions; bf16 D rounds to 8.
    assert ref.rel_err(gpu, cpu) < (4 * 2.0**-14 if out_dtype == jnp.float32 else 2 * 2.0**-8)


def test_fp8_gemm_with_bias_gelu(rng):
    a = qj.quantize(random(rng, (128, 96)), jnp.float32(8.0))
    b = qj.quantize(random(rng, (64, 96)), jnp.float32(16.0))
    bias = random(rng, (64,), jnp.bfloat16)
    gpu, cpu = on_both(
        lambda qa, qb, sa, sb, bias: gemm(
            qa,
            qb,
            sa,
            sb,
            trans_b=True,
            epilogue=Epilogue.BIAS_GELU_AUX,
            bias=bias,
            out_dtype=jnp.bfloat16,
        ),
        a.q,
        b.q,
        a.scale_inv,
        b.scale_inv,
        bias,
    )
    for g, c in zip(gpu, cpu):
        assert ref.rel_err(g, c) < 1e-2


def test_bf16_gemm(rng):
    a, b = random(rng, (128, 96), jnp.bfloat16), random(rng, (96, 64), jnp.bfloat16)
    gpu, cpu = on_both(lambda a, b: gemm(a, b, trans_b=False, out_dtype=jnp.float32), a, b)
    assert ref.rel_err(gpu, cpu) < 1e-5


def test_layer_norm(rng):
    x = random(rng, (64, 256), scale=3.0)  # qmesh's LayerNorm is float32
    gamma, beta = random(rng, (256,)), random(rng, (256,))

    def loss(x, g, b):
        return jnp.sum(jnp.square(layer_norm(x, g, b).astype(jnp.float32)))

    gpu, cpu = on_both(jax.value_and_grad(loss, argnums=(0, 1, 2)), x, gamma, beta)
    for g, c in zip(jax.tree.leaves(gpu), jax.tree.leaves(cpu)):
        assert ref.rel_err(g, c) < 1e-5


@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_fused_norm_is_bitwise_equal(rng, x_dtype, rms):
    # y, the codes (both layouts), amax, scale_inv, mean and rstd: one summation order on both
    x = random(rng, (96, 300), x_dtype, scale=3.0)
    gamma, beta = random(rng, (300,)), None if rms else random(rng, (300,))

    def fused(x, g):
        return norm_fwd_quantize(x, g, beta, jnp.float32(20.0), E4M3, columnwise=True), (
            norm_fwd_amax(x, g, beta)
        )

    gpu, cpu = on_both(fused, x, gamma)
    assert_bitwise(gpu, cpu)


@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize(
    "recipe", [DelayedScaling(), Float8CurrentScaling()], ids=["delayed", "current"]
)
def test_dense_forward_and_backward(rng, recipe, x_dtype):
    x = random(rng, (256, 128), x_dtype)
    kernel = random(rng, (128, 64), jnp.float32, scale=0.1)
    bias = random(rng, (64,), jnp.float32, scale=0.1)
    state = qdense.init_state(recipe)

    def loss(x, kernel, bias, state):
        y = qdense.dense(x, kernel, bias, state, recipe=recipe, activation="gelu")
        return jnp.sum(jnp.square(y.astype(jnp.float32)))

    gpu, cpu = on_both(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), x, kernel, bias, state)
    assert ref.rel_err(gpu[0], cpu[0]) < 2e-2
    for name, g, c in zip(("dx", "dkernel", "dbias"), gpu[1][:3], cpu[1][:3]):
        assert ref.rel_err(g, c) < 5e-2, name
    # The updated delayed-scaling state (amax histories and scales) agrees too.
    for g, c in zip(jax.tree.leaves(gpu[1][3]), jax.tree.leaves(cpu[1][3])):
        np.testing.assert_allclose(g, c, rtol=2e-2)


@pytest.mark.parametrize("in_dtype", [jnp.float32, jnp.bfloat16])
def test_gelu_casts_are_bitwise_equal(rng, in_dtype):
    """GELU inside the casts: codes, amax and scales bit for bit (the dbias to summation order)."""
    pre = random(rng, (128, 96), in_dtype, scale=3.0)
    dh = random(rng, (128, 96), in_dtype)

    def casts(pre, dh):
        return (
            gelu_quantize(pre, jnp.float32(4.0), E4M3, columnwise=True),
            gelu_quantize_current(pre, E4M3, columnwise=True),
            dgelu_dbias_quantize(dh, pre, jnp.float32(2.0), E5M2, columnwise=True),
            dgelu_dbias_quantize_current(dh, pre, E5M2, columnwise=True),
        )

    gpu, cpu = on_both(casts, pre, dh)
    for i, (g, c) in enumerate(zip(gpu, cpu)):
        quantized = g if i < 2 else g[0]
        for a, b in zip(quantized, c if i < 2 else c[0]):
            np.testing.assert_array_equal(bits(a), bits(b))
        if i >= 2:
            assert ref.rel_err(g[1], c[1]) < 1e-5


@pytest.mark.parametrize(
    "recipe", [DelayedScaling(), Float8CurrentScaling()], ids=["delayed", "current"]
)
def test_fused_mlp_forward_and_backward(rng, recipe):
    x = random(rng, (256, 128), jnp.bfloat16)
    kernels = (
        random(rng, (128, 256), jnp.bfloat16, 0.1),
        random(rng, (256, 128), jnp.bfloat16, 0.1),
    )
    biases = (random(rng, (256,), jnp.bfloat16, 0.1), random(rng, (128,), jnp.bfloat16, 0.1))
    states = (qdense.init_state(recipe), qdense.init_state(recipe))

    def loss(x, kernels, biases, states):
        y = mlp(x, kernels, biases, states, recipe=recipe)
        return jnp.sum(jnp.square(y.astype(jnp.float32)))

    gpu, cpu = on_both(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), x, kernels, biases, states)
    assert ref.rel_err(gpu[0], cpu[0]) < 2e-2
    for g, c in zip(jax.tree.leaves(gpu[1][:3]), jax.tree.leaves(cpu[1][:3])):
        assert ref.rel_err(g, c) < 5e-2
    for g, c in zip(jax.tree.leaves(gpu[1][3]), jax.tree.leaves(cpu[1][3])):
        np.testing.assert_allclose(g, c, rtol=2e-2)


@pytest.mark.parametrize("gemm", mgt.SHAPES)
@pytest.mark.parametrize("fmt", mgt.RECIPES)
def test_microscaled_gemm_handler_equals_the_python_emulation(fmt, gemm):
    # The handler on the GPU (native on compute capability 10.0+, the C++ emulation below it)
    # against the Python emulation of the same codes (fp32 accumulation in another order).
    a, b, want = mgt.copies(fmt, *mgt.SHAPES[gemm])
    assert mgt.rel(mgt.call(fmt, a, b), want) < 1e-5


@pytest.mark.parametrize("fmt", mgt.RECIPES)
def test_microscaled_dense_runs_the_handler_and_counts_only_emulated_gemms(fmt):
    x, k = jnp.ones((64, 32), jnp.float32), jnp.ones((32, 32), jnp.float32)

    def f(x, k):
        return qj.dense(x, k, None, recipe=mgt.RECIPES[fmt], sr_key=jax.random.key(0))

    qstats.reset_stats()
    assert "qmesh_microscaled_gemm" in jax.jit(f).lower(x, k).as_text()
    counted = qstats.stats()["emulated_gemms"]
    assert counted == (0 if emulation.runs_natively(GPU) else 1)
