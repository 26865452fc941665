"""The Float8BlockScaling recipe in JAX: the recipe's fields, the block quantize / dbias +
quantize / dequantize primitives against a numpy (ml_dtypes, float64) reference, the
block-scaled GEMM against float64 from codes and scales, dense and mlp forward and backward
against float64, and sharded == unsharded with no amax collective."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import reference as ref
from conftest import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax.block_quantize import block_scale_shape, grouped_scale_size
from qmesh.jax.gemm import Epilogue
from qmesh.jax.mlp import mlp
from qmesh.jax.recipe import (
    Float8BlockScaling,
    Float8CurrentScaling,
    MMParams,
    QParams,
    check_recipe,
)

E4M3 = ml_dtypes.float8_e4m3fn


# ---- the recipe -------------------------------------------------------------------------------


def test_recipe_defaults_are_transformer_engines():
    r = Float8BlockScaling()
    check_recipe(r)
    assert r.fp8_format == qj.recipe.Format.E4M3
    assert (r.x_block_scaling_dim, r.w_block_scaling_dim, r.grad_block_scaling_dim) == (1, 2, 1)
    for q in (r.fp8_quant_fwd_inp, r.fp8_quant_fwd_weight, r.fp8_quant_bwd_grad):
        assert q == QParams(power_2_scale=True, amax_epsilon=0.0)
    for m in (r.fp8_gemm_fprop, r.fp8_gemm_dgrad, r.fp8_gemm_wgrad):
        assert m.use_split_accumulator is True
    assert not r.fp8_dpa and not r.fp8_mha
    assert qj.dense.init_state(r) is None


@pytest.mark.parametrize(
    "kwargs, error, field",
    [
        (dict(x_block_scaling_dim=3), ValueError, "x_block_scaling_dim"),
        (dict(grad_block_scaling_dim=True), TypeError, "grad_block_scaling_dim"),
        (dict(x_block_scaling_dim=2), ValueError, "at most one"),
        (dict(fp8_dpa=True), ValueError, "fp8_dpa"),
        (dict(fp8_mha=True), ValueError, "fp8_mha"),
        (dict(fp8_gemm_wgrad=MMParams(False)), ValueError, "fp8_gemm_wgrad"),
        (dict(fp8_quant_fwd_inp=0.5), TypeError, "fp8_quant_fwd_inp"),
        (dict(fp8_format="E4M3"), TypeError, "fp8_format"),
    ],
)
def test_recipe_errors_name_the_field(kwargs, error, field):
    with pytest.raises(error, match=field):
        Float8BlockScaling(**kwargs)


def test_qparams_errors_name_the_field():
    with pytest.raises(ValueError, match="amax_epsilon"):
        QParams(amax_epsilon=-1.0)
    with pytest.raises(TypeError, match="power_2_scale"):
        QParams(power_2_scale="yes")


# ---- the numpy reference ----------------------------------------------------------------------


def ref_block_quantize(x, block, power_of_two=True, epsilon=0.0, dtype=E4M3):
    """(codes uint8, scale_inv) of x [R, C], the scales one per block (block_scale_shape)."""
    x = np.asarray(x, np.float32)
    rows, cols = x.shape
    codes = np.zeros((rows, cols), np.uint8)
    scales = np.zeros(block_scale_shape(rows, cols, block), np.float32)
    edge = (1, 128) if block == 1 else (128, 128)
    for r0 in range(0, rows, edge[0]):
        for c0 in range(0, cols, edge[1]):
            tile = x[r0 : r0 + edge[0], c0 : c0 + edge[1]]
            s = ref.current_scale(ref.amax(tile), dtype, power_of_two, epsilon)
            codes[r0 : r0 + edge[0], c0 : c0 + edge[1]] = ref.quantize(tile, s, dtype)
            scales[r0 // edge[0], c0 // 128] = np.float32(1) / s
    return codes, scales


def decoded(codes, scales, block, dtype=E4M3):
    """code * scale_inv of its block, float64."""
    codes = np.asarray(codes).view(np.uint8).view(dtype).astype(np.float64)
    rows, cols = codes.shape
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    s = np.asarray(scales, np.float64)
    per = s[r, c // 128] if block == 1 else s[r // 128, c // 128]
    return codes * per


def outliers(rng, shape, factor=1e3):
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[:: max(1, x.size // 5)] *= factor  # a few values far above the rest
    return x


# ---- block quantize, dbias + quantize, dequantize ---------------------------------------------


@pytest.mark.parametrize("shape", [(256, 384), (130, 300), (3, 7)])
@pytest.mark.parametrize("block", [1, 2])
@pytest.mark.parametrize("power_2", [True, False])
def test_block_quantize_matches_the_reference(rng, shape, block, power_2):
    x = outliers(rng, shape)
    q, s, q_t, s_t = jax.jit(
        lambda v: qj.block_quantize(v, block=block, columnwise=True, power_2_scale=power_2)
    )(x)
    assert s.shape == block_scale_shape(*shape, block) and s_t.shape == block_scale_shape(
        *shape[::-1], block
    )
    for got_q, got_s, src in ((q, s, x), (q_t, s_t, x.T)):
        want_q, want_s = ref_block_quantize(src, block, power_2)
        assert ref.codes_equal(got_q, want_q, E4M3)
        np.testing.assert_array_equal(np.asarray(got_s), want_s)
    # dequantize: code * scale_inv exactly (fp32 output)
    np.testing.assert_array_equal(
        np.asarray(qj.block_dequantize(q, s, block=block)), decoded(q, s, block).astype(np.float32)
    )


def test_block_scaling_beats_per_tensor_on_outliers(rng):
    """Outliers 1e5 above the rest push E4M3's per-tensor codes of the other values into the
    subnormals; 1x128 blocks keep them normal outside the outliers' blocks (measured: the
    relative error of the non-outlier values drops about 7x)."""
    x = outliers(rng, (256, 512), 1e5)
    q, s, _, _ = qj.block_quantize(x)
    pt = qj.quantize_current(x, jnp.float8_e4m3fn)
    per_tensor = np.asarray(pt.q).astype(np.float64) * float(pt.scale_inv)
    small = np.abs(x) < 100  # the values the outliers push toward underflow
    want = x[small].astype(np.float64)
    block_err = ref.rel_err(decoded(q, s, 1)[small], want)
    ratio = ref.rel_err(per_tensor[small], want) / block_err
    assert block_err < 0.05 and ratio > 4, (block_err, ratio)


def test_block_dbias_quantize(rng):
    g = outliers(rng, (200, 256))
    q, s, q_t, s_t, dbias = jax.jit(lambda v: qj.block_dbias_quantize(v, columnwise=True))(g)
    want_q, want_s = ref_block_quantize(g, 1)
    assert ref.codes_equal(q, want_q, E4M3)
    np.testing.assert_array_equal(np.asarray(s), want_s)
    assert ref.rel_err(dbias, g.astype(np.float64).sum(0)) < 1e-6


def test_block_primitives_clear_errors():
    x = jnp.ones((4, 256), jnp.float32)
    with pytest.raises(ValueError, match="block must be 1"):
        qj.block_quantize(x, block=3)
    with pytest.raises(ValueError, match="reshape it to 2-D"):
        qj.block_quantize(jnp.ones((2, 4, 256)))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        qj.block_quantize(x.astype(jnp.int32))
    q, s, _, _ = qj.block_quantize(x)
    with pytest.raises(ValueError, match=r"must be float32\[4, 2\] \(block_scale_shape\)"):
        qj.block_dequantize(q, s[:1])
    with pytest.raises(ValueError, match="amax_epsilon"):
        qj.block_quantize(x, amax_epsilon=-1.0)


# ---- grouped block quantize -------------------------------------------------------------------


def cpp_layout(scales, block):
    """Scales one per block -> the C++ layout (include/qmesh/block_quantized_tensor.h)."""
    s = scales.T if block == 1 else scales
    return np.pad(s, ((0, 0), (0, -s.shape[1] % 4)))


@pytest.mark.parametrize("block", [1, 2])
@pytest.mark.parametrize("sizes", [[130, 0, 3, 256, 1], [384], [0, 7]], ids=["5", "1", "empty"])
def test_grouped_block_quantize_is_block_quantize_of_each_group(rng, block, sizes):
    """Each group: the numpy reference of its own rows (its own blocks from its first row),
    bit for bit, and block_quantize of it; scales flat in the C++ layout, then zeros."""
    cols = 300
    x = outliers(rng, (sum(sizes), cols))
    f = jax.jit(lambda v, g: qj.grouped_block_quantize(v, g, block=block, columnwise=True))
    q, s, q_t, s_t = (np.asarray(a) for a in f(x, np.asarray(sizes, np.int32)))
    size = grouped_scale_size
    assert s.shape == (size(len(x), cols, len(sizes), block),)
    assert s_t.shape == (size(len(x), cols, len(sizes), block, columnwise=True),)
    want_q, want_q_t, want_s, want_s_t = [], [], [], []
    start = 0
    for n in sizes:
        part = x[start : start + n]
        start += n
        if n == 0:
            continue
        for src, codes, scales in ((part, want_q, want_s), (part.T, want_q_t, want_s_t)):
            c, sc = ref_block_quantize(src, block)
            codes.append(c.reshape(-1))
            scales.append(cpp_layout(sc, block).reshape(-1))
        one = qj.block_quantize(part, block=block, columnwise=True)  # the same, via the op
        np.testing.assert_array_equal(np.asarray(one[3]), ref_block_quantize(part.T, block)[1])

    def flat(parts, length):
        got = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        return np.pad(got, (0, length - got.size))

    assert ref.codes_equal(q.reshape(-1), np.concatenate(want_q), E4M3)
    assert ref.codes_equal(q_t, np.concatenate(want_q_t), E4M3)
    np.testing.assert_array_equal(s, flat(want_s, s.size))  # the tail zero included
    np.testing.assert_array_equal(s_t, flat(want_s_t, s_t.size))


def test_grouped_block_quantize_clear_errors():
    x = jnp.ones((8, 256), jnp.float32)
    f = jax.jit(lambda v, g: qj.grouped_block_quantize(v, g))
    with pytest.raises(Exception, match="group_sizes add up to 7 rows but x has 8 rows"):
        f(x, np.asarray([3, 4], np.int32))[0].block_until_ready()
    with pytest.raises(Exception, match="group_sizes must not be negative"):
        f(x, np.asarray([10, -2], np.int32))[0].block_until_ready()
    with pytest.raises(TypeError, match="group_sizes must be int32"):
        qj.grouped_block_quantize(x, np.asarray([8.0], np.float32))
    with pytest.raises(ValueError, match="no groups for 8 rows"):
        qj.grouped_block_quantize(x, np.zeros(0, np.int32))
    with pytest.raises(ValueError, match="block must be 1"):
        qj.grouped_block_quantize(x, np.asarray([8], np.int32), block=0)


# ---- the block-scaled GEMM --------------------------------------------------------------------


@pytest.mark.parametrize("blocks", [(1, 2), (1, 1), (2, 1)], ids=["1Dx2D", "1Dx1D", "2Dx1D"])
@pytest.mark.parametrize("mkn", [(64, 256, 384), (100, 300, 136)])
def test_block_gemm_matches_float64(rng, blocks, mkn):
    m, k, n = mkn
    a, b = outliers(rng, (m, k)), rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    qa, sa, _, _ = qj.block_quantize(a, block=blocks[0])
    qb, sb, _, _ = qj.block_quantize(b, block=blocks[1])
    d = jax.jit(
        lambda *v: qj.gemm(*v, a_block=blocks[0], b_block=blocks[1], epilogue="bias", bias=bias)
    )(qa, qb, sa, sb)
    want = decoded(qa, sa, blocks[0]) @ decoded(qb, sb, blocks[1]).T + bias
    assert ref.rel_err(d, want) < 1e-6


def test_block_gemm_clear_errors(rng):
    a = rng.standard_normal((128, 256)).astype(np.float32)
    qa, sa, qa_t, sa_t = qj.block_quantize(a, columnwise=True)
    qw, sw, _, _ = qj.block_quantize(a, block=2)
    with pytest.raises(ValueError, match="TN form"):
        qj.gemm(qa_t, qa_t, sa_t, sa_t, trans_a=True, trans_b=False, a_block=1, b_block=1)
    with pytest.raises(ValueError, match="two operands in 128x128"):
        qj.gemm(qw, qw, sw, sw, a_block=2, b_block=2)
    with pytest.raises(TypeError, match="both operands block-scaled"):
        qj.gemm(qa, qa, sa, sa, a_block=1)
    with pytest.raises(ValueError, match=r"b_scale_inv of a \[128, 256\] tensor in 128x128"):
        qj.gemm(qa, qw, sa, sa, a_block=1, b_block=2)
    with pytest.raises(ValueError, match="block must be 1"):
        qj.gemm(qa, qa, sa, sa, a_block=1, b_block=5)


# ---- sharding ---------------------------------------------------------------------------------


def _put(mesh, v, spec):
    return jax.device_put(v, NamedSharding(mesh, spec))


@pytest.mark.parametrize("block", [1, 2])
@pytest.mark.parametrize("spec", [P("dp", "tp"), P("tp", "dp"), P(None, ("dp", "tp"))])
def test_sharded_block_quantize_equals_unsharded(mesh, rng, block, spec):
    x = outliers(rng, (1024, 1024))
    f = jax.jit(lambda v: qj.block_dbias_quantize(v, block=block, columnwise=True))
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        got = f(_put(mesh, x, spec))
    want = f(x)
    for g, w in zip(got[:4], want[:4]):  # codes and scales: bit for bit
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
    assert ref.rel_err(got[4], want[4]) < 1e-6  # dbias: summed in another order

    # The scales are sharded with their data: quantize and dequantize move nothing.
    def roundtrip(v):
        q, s, q_t, s_t = qj.block_quantize(v, block=block, columnwise=True)
        return qj.block_dequantize(q, s, block=block), qj.block_dequantize(q_t, s_t, block=block)

    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        hlo = jax.jit(roundtrip).lower(_put(mesh, x, spec)).compile().as_text()
    moves = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")
    assert not [ln for ln in hlo.splitlines() if any(f" {m}" in ln for m in moves)]


@pytest.mark.parametrize("block", [1, 2])
def test_row_shards_of_any_size_carry_their_scales(mesh, rng, block):
    """Rows that are no multiple of 4 (the C++ layout's padding) or of 128 a shard: the
    scales are sharded with their rows, bit for bit, and dequantize on the shards."""
    rows = 6 * 8 if block == 1 else 128 * 8  # 6 rows a device over dp x tp
    x = outliers(rng, (rows, 384))
    spec = P(("dp", "tp"), None)

    def f(v):
        q, s, _, _ = qj.block_quantize(v, block=block)
        return q, s, qj.block_dequantize(q, s, block=block)

    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        got = jax.jit(f)(_put(mesh, x, spec))
    want = f(x)
    assert got[1].sharding.spec[0] == ("dp", "tp")  # the scales' rows follow x's rows
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))


def test_sharding_that_cuts_a_block_is_a_clear_error():
    mesh = make_mesh((2, 4))
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        x = _put(mesh, np.ones((256, 256), np.float32), P(None, "tp"))  # 64 columns a shard
        want = r"x \[256, 256\]: the columns \(256\) is sharded over mesh axes \('tp',\) into "
        with pytest.raises(Exception, match=want + "shards of 64.*would cut a scaling block"):
            jax.jit(qj.block_quantize)(x)[0].block_until_ready()
        x = _put(mesh, np.ones((256, 256), np.float32), P("tp", None))  # 64 rows a shard
        with pytest.raises(Exception, match=r"the rows \(128x128 tiles\).*multiples of 128"):
            jax.jit(lambda v: qj.block_quantize(v, block=2))(x)[0].block_until_ready()
        with pytest.raises(Exception, match=r"its columnwise copy \[256, 256\]: the columns"):
            jax.jit(lambda v: qj.block_quantize(v, columnwise=True))(x)[0].block_until_ready()


# ---- dense and mlp ----------------------------------------------------------------------------

B, S, K, N = 8, 128, 512, 512


def _data(rng):
    x = rng.standard_normal((B, S, K)).astype(np.float32)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    r = rng.standard_normal((B, S, N)).astype(np.float32)
    return x, w, b, r


def _step(recipe):
    def loss(x, w, b, r):
        return jnp.sum(qj.dense(x, w, b, recipe=recipe, activation="gelu") * r)

    return jax.jit(
        lambda x, w, b, r: (
            qj.dense(x, w, b, recipe=recipe, activation="gelu"),
            jax.grad(loss, argnums=(0, 1, 2))(x, w, b, r),
        )
    )


def test_dense_forward_and_backward_against_float64(rng):
    x, w, b, r = _data(rng)
    y, (dx, dw, db) = _step(Float8BlockScaling())(x, w, b, r)
    # forward: exactly the float64 GEMM of the block-dequantized operands (then GELU)
    qx, sx = ref_block_quantize(x.reshape(-1, K), 1)
    qw, sw = ref_block_quantize(w.T, 2)  # the kernel's columnwise copy [N, K]
    pre = decoded(qx, sx, 1) @ decoded(qw, sw, 2).T + b
    assert ref.rel_err(y.reshape(-1, N), np.asarray(qj.gemm.gelu(pre))) < 1e-5
    # backward: against float64 of the unquantized layer, at FP8 (E4M3) tolerance
    x64, w64 = x.reshape(-1, K).astype(np.float64), w.astype(np.float64)
    pre64 = x64 @ w64 + b
    g = r.reshape(-1, N) * np.asarray(qj.gemm.dgelu(jnp.asarray(pre64, jnp.float32)), np.float64)
    assert ref.rel_err(dx.reshape(-1, K), g @ w64.T) < 0.06
    assert ref.rel_err(dw, x64.T @ g) < 0.06
    assert ref.rel_err(db, g.sum(0)) < 0.06


LAYOUTS = {  # (x spec, kernel spec, bias spec), and the results each device computes from
    # whole rows and columns of the unsharded GEMMs (bit for bit; the others are sums over
    # shards, in another order)
    "column": ((P("dp", None, None), P(None, "tp"), P("tp")), ("y",)),
    "row": ((P("dp", None, "tp"), P("tp", None), P(None)), ()),
    "dp": ((P(("dp", "tp"), None, None), P(None, None), P(None)), ("y", "dx")),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sharded_dense_equals_unsharded(mesh, rng, layout):
    x, w, b, r = _data(rng)
    (xs, ws, bs), bitwise = LAYOUTS[layout]
    f = _step(Float8BlockScaling())
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        got = f(_put(mesh, x, xs), _put(mesh, w, ws), _put(mesh, b, bs), _put(mesh, r, xs))
    want = f(x, w, b, r)
    for name, g, wv in zip(("y", "dx", "dw", "db"), jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == wv.shape
        if name in bitwise:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(wv), err_msg=name)
        else:
            assert ref.rel_err(g, wv) < 1e-5, name


def test_hlo_of_a_sharded_block_step_has_no_amax_all_reduce(rng):
    mesh = make_mesh((2, 4))
    x, w, b, r = _data(rng)
    xs, ws, bs = LAYOUTS["column"][0]
    args = (_put(mesh, x, xs), _put(mesh, w, ws), _put(mesh, b, bs), _put(mesh, r, xs))
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp")):
        hlo = _step(Float8BlockScaling()).lower(*args).compile().as_text()
    reduces = [ln for ln in hlo.splitlines() if " all-reduce(" in ln or " all-reduce-start(" in ln]
    comps = [hlo.split(f"\n{ln.split('to_apply=')[1].split(',')[0]} (")[1] for ln in reduces]
    assert not any("maximum" in c.split("\n}")[0] for c in comps), reduces  # no amax
    # Only the parameter gradients' sums over dp (wgrad and the bias gradient).
    shapes = sorted(ln.split("=", 1)[1].split(" all-reduce")[0].strip() for ln in reduces)
    assert 1 <= len(reduces) <= 2 and all("f32[" in s for s in shapes), reduces


MLP_LAYOUTS = {  # x, kernels, biases; MeshResource extras; the results that are bitwise equal
    # data parallel: every result row comes from its own rows (the weight gradients are
    # sums over the rows, the bias gradients too: another order)
    "dp": ((P("dp"), P(), P(), P(), P()), {}, ("y", "dx")),
    # fc1 column, fc2 row parallel: fc2's output and dx are sums over the hidden shards
    "tp": ((P("dp"), P(None, "tp"), P("tp", None), P("tp"), P()), {}, ()),
    # and sequence parallel: x's sequence sharded over tp, fc2's output reduce-scattered
    "sp": (
        (P("dp", "tp"), P(None, "tp"), P("tp", None), P("tp"), P()),
        {"tpsp_resource": "tp"},
        (),
    ),
}


@pytest.mark.parametrize("layout", MLP_LAYOUTS)
def test_sharded_mlp_equals_unsharded(rng, layout):
    """The block-scaled MLP over dp, tp and SP against one device: bit for bit where each
    device computes its results from its own rows, else only summed in another order."""
    mesh = make_mesh((2, 4))
    b, s, h, f = 4, 128, 512, 1024
    x = outliers(rng, (b, s, h))
    k1 = (rng.standard_normal((h, f)) / np.sqrt(h)).astype(np.float32)
    k2 = (rng.standard_normal((f, h)) / np.sqrt(f)).astype(np.float32)
    b1, b2 = rng.standard_normal(f).astype(np.float32), rng.standard_normal(h).astype(np.float32)
    r = rng.standard_normal((b, s, h)).astype(np.float32)
    recipe = Float8BlockScaling()

    def y(x, k1, k2, b1, b2):
        return mlp(x, (k1, k2), (b1, b2), recipe=recipe)

    step = jax.jit(
        lambda *a: (y(*a), jax.grad(lambda *v: jnp.sum(y(*v) * r), argnums=range(5))(*a))
    )
    specs, extra, bitwise = MLP_LAYOUTS[layout]
    args = (x, k1, k2, b1, b2)
    with qj.global_shard_guard(qj.MeshResource(dp_resource="dp", tp_resource="tp", **extra)):
        got = step(*(_put(mesh, v, sp) for v, sp in zip(args, specs)))
    want = step(*args)
    names = ("y", "dx", "dk1", "dk2", "db1", "db2")
    for name, g, w in zip(names, jax.tree.leaves(got), jax.tree.leaves(want)):
        if name in bitwise:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=name)
        else:
            assert ref.rel_err(g, w) < 1e-6, name


def test_mlp_with_the_block_recipe_against_float64(rng):
    h, f = 256, 512
    x = rng.standard_normal((256, h)).astype(np.float32)
    w1 = (rng.standard_normal((h, f)) / np.sqrt(h)).astype(np.float32)
    w2 = (rng.standard_normal((f, h)) / np.sqrt(f)).astype(np.float32)
    b1, b2 = np.zeros(f, np.float32), np.zeros(h, np.float32)
    recipe = Float8BlockScaling()

    def loss(x, w1, w2):
        return jnp.sum(mlp(x, (w1, w2), (b1, b2), recipe=recipe) ** 2)

    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(x, w1, w2)
    x64, w164, w264 = (v.astype(np.float64) for v in (x, w1, w2))
    pre = x64 @ w164
    hid = np.asarray(qj.gemm.gelu(jnp.asarray(pre, jnp.float32)), np.float64)
    y = hid @ w264
    dy = 2 * y
    dpre = (dy @ w264.T) * np.asarray(qj.gemm.dgelu(jnp.asarray(pre, jnp.float32)), np.float64)
    want = (np.sum(y**2), (dpre @ w164.T, x64.T @ dpre, hid.T @ dy))
    assert abs(float(got[0]) - want[0]) / want[0] < 0.03
    for g, wv in zip(got[1], want[1]):
        assert ref.rel_err(g, wv) < 0.08


def _gemm_epilogues(recipe, rng):
    """The epilogue of every qmesh GEMM in a bf16 dense step with bias and GELU."""
    x = jnp.asarray(rng.standard_normal((128, K)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((K, N)) * 0.1, jnp.float32)
    b = jnp.asarray(rng.standard_normal(N) * 0.1, jnp.float32)

    def loss(x, w, b):
        y = qj.dense(x, w, b, recipe=recipe, activation="gelu")
        return jnp.sum(jnp.square(y.astype(jnp.float32)))

    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, w, b).as_text()
    return [int(m) for m in re.findall(r"epilogue = (\d+) : i32", text)]


def test_block_scaled_dense_asks_no_gemm_for_bias_gelu_with_aux(rng):
    """cuBLASLt (Hopper) refuses a block-scaled GEMM with bias + GELU and the aux: dense adds
    them after the GEMM instead, where per-tensor FP8 fuses them."""
    assert int(Epilogue.BIAS_GELU_AUX) in _gemm_epilogues(Float8CurrentScaling(), rng)
    block = _gemm_epilogues(Float8BlockScaling(), rng)
    assert len(block) == 3 and int(Epilogue.BIAS_GELU_AUX) not in block
