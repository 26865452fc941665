"""The MXFP8BlockScaling recipe in JAX: the recipe's fields, the E8M0 decoding of every byte
against ml_dtypes, the MXFP8 quantize / dbias + quantize / dequantize primitives against a
numpy (ml_dtypes, float64) reference, sharded == unsharded, and dense forward and backward
with emulated GEMMs against float64 (counted), and the error without emulation."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax import stats as qstats
from qmesh.jax.mlp import mlp
from qmesh.jax.recipe import MXFP8BlockScaling

E8M0 = ml_dtypes.float8_e8m0fnu


def test_recipe_defaults_are_transformer_engines():
    r = MXFP8BlockScaling()
    assert r.fp8_format == qj.recipe.Format.E4M3
    assert r.margin == 0.0 and not r.fp8_dpa and not r.fp8_mha and not r.emulate
    with pytest.raises(ValueError, match="margin must be finite and >= 0"):
        MXFP8BlockScaling(margin=-1)
    with pytest.raises(ValueError, match="fp8_dpa must be False"):
        MXFP8BlockScaling(fp8_dpa=True)
    with pytest.raises(TypeError, match="emulate must be True or False"):
        MXFP8BlockScaling(emulate="yes")


def test_every_e8m0_byte_decodes_like_ml_dtypes():
    # Row r: codes of 1.0 with scale byte r: dequantized, 2^(r - 127) (NaN for 0xFF).
    scale = np.arange(256, dtype=np.uint8).view(E8M0).reshape(256, 1)
    q = np.ones((256, 32), np.float32).astype(ml_dtypes.float8_e4m3fn)
    out = np.asarray(qj.mxfp8_dequantize(q, scale))
    want = np.broadcast_to(scale.astype(np.float32), (256, 32))
    np.testing.assert_array_equal(out, want)  # NaN == NaN for assert_array_equal


def reference(x, fp8, margin=0.0):
    """Codes and E8M0 scales of x [R, C] in 1x32 blocks: the scale rounds amax / (fp8_max *
    2^-margin) (one fp32 division) up to a power of two."""
    x = np.asarray(x, np.float64)
    rows, cols = x.shape
    amax = np.abs(x).reshape(rows, cols // 32, 32).max(axis=2)
    scaled_max = np.float32(float(ml_dtypes.finfo(fp8).max) / 2.0**margin)
    q = (amax.astype(np.float32) / scaled_max).astype(np.float64)
    e = np.clip(np.ceil(np.log2(np.where(q > 0, q, 2.0**-127))), -127, 127).astype(np.int64)
    codes = (x * np.repeat(2.0 ** (-e.astype(np.float64)), 32, axis=1)).astype(np.float32)
    return codes.astype(fp8), (e + 127).astype(np.uint8)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("fp8", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_quantize_matches_reference_in_both_copies(dtype, fp8):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 96)) * np.exp2(rng.integers(-8, 8, (64, 96)))).astype(dtype)
    q, s, q_t, s_t = qj.mxfp8_quantize(x, fp8, columnwise=True, margin=1.0)
    xf = np.asarray(x, np.float32)
    codes, scales = reference(xf, fp8, margin=1.0)
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), codes.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(s).view(np.uint8), scales)
    codes_t, scales_t = reference(xf.T, fp8, margin=1.0)
    np.testing.assert_array_equal(np.asarray(q_t).view(np.uint8), codes_t.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(s_t).view(np.uint8), scales_t)
    back = np.asarray(qj.mxfp8_dequantize(q, s))
    want = codes.astype(np.float64) * np.repeat(2.0 ** (scales.astype(np.float64) - 127), 32, 1)
    np.testing.assert_array_equal(back, want.astype(np.float32))


def test_dbias_and_refusals():
    g = np.random.default_rng(1).standard_normal((96, 64)).astype(np.float32)
    *_, dbias = qj.mxfp8_dbias_quantize(g)
    np.testing.assert_allclose(np.asarray(dbias), g.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="multiples of 32"):
        qj.mxfp8_quantize(np.zeros((20, 64), np.float32))


def test_sharded_quantize_equals_unsharded():
    mesh = make_mesh((2, 4), ("dp", "tp"))
    x = np.random.default_rng(2).standard_normal((128, 256)).astype(np.float32)
    want = qj.mxfp8_quantize(x, columnwise=True)
    xs = jax.device_put(x, NamedSharding(mesh, P("dp", "tp")))
    got = jax.jit(lambda v: qj.mxfp8_quantize(v, columnwise=True))(xs)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_dense_with_emulated_gemms_matches_float64_and_is_counted():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    k = (rng.standard_normal((96, 128)) / 10).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    g = rng.standard_normal((64, 128)).astype(np.float32)
    recipe = MXFP8BlockScaling(emulate=True)
    qstats.reset_stats()

    def f(x, k, b):
        return qj.dense(x, k, b, recipe=recipe)

    y, vjp = jax.vjp(f, x, k, b)
    dx, dk, db = vjp(g)
    assert qstats.stats()["emulated_gemms"] == 3
    x64, k64, g64 = (a.astype(np.float64) for a in (x, k, g))

    def rel(a, want):
        return np.linalg.norm(np.asarray(a, np.float64) - want) / np.linalg.norm(want)

    assert 1e-4 < rel(y, x64 @ k64 + b) < 0.05
    assert rel(dx, g64 @ k64.T) < 0.05
    assert rel(dk, x64.T @ g64) < 0.05
    assert rel(db, g64.sum(0)) < 1e-5


def test_dense_without_emulation_raises_naming_the_device():
    x = np.zeros((32, 64), np.float32)
    k = np.zeros((64, 32), np.float32)
    with pytest.raises(ValueError, match="CPU backend has no native MXFP8 GEMM.*emulate=True"):
        qj.dense(x, k, recipe=MXFP8BlockScaling())


def test_mlp_is_the_two_emulated_dense_layers():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    k1 = (rng.standard_normal((64, 96)) / 8).astype(np.float32)
    k2 = (rng.standard_normal((96, 64)) / 8).astype(np.float32)
    b1 = rng.standard_normal(96).astype(np.float32)
    recipe = MXFP8BlockScaling(emulate=True)

    def fused(x, k1, k2):
        return jnp.sum(mlp(x, (k1, k2), (b1, None), recipe=recipe) ** 2)

    def composed(x, k1, k2):
        h = qj.dense(x, k1, b1, recipe=recipe, activation="gelu")
        return jnp.sum(qj.dense(h, k2, recipe=recipe) ** 2)

    for a, b in zip(
        jax.grad(fused, (0, 1, 2))(x, k1, k2), jax.grad(composed, (0, 1, 2))(x, k1, k2)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="takes no states"):
        mlp(x, (k1, k2), states=({}, None), recipe=recipe)


def test_flax_modules_take_the_recipe():
    from qmesh.jax.flax import DenseGeneral, LayerNormMLP

    x = jnp.asarray(np.random.default_rng(5).standard_normal((8, 4, 32)), jnp.float32)
    mx = MXFP8BlockScaling(emulate=True)
    for make in (
        lambda r: LayerNormMLP(intermediate_dim=64, recipe=r),
        lambda r: DenseGeneral(features=64, recipe=r),
    ):
        v = make(None).init(jax.random.key(0), x)

        def out(r):
            y = make(r).apply(v, x)
            return y[0] if isinstance(y, tuple) else y

        want = np.asarray(out(None), np.float64)
        got = np.asarray(out(mx), np.float64)
        assert 1e-4 < np.linalg.norm(got - want) / np.linalg.norm(want) < 0.08
    with pytest.raises(ValueError, match="multiples of 32"):
        DenseGeneral(features=48, recipe=mx).init(jax.random.key(0), x)
