"""qmesh.jax.nvfp4_quantize / nvfp4_dequantize (the C++ host op through its FFI handler) against
ml_dtypes' float4_e2m1fn and float8_e4m3fn and a numpy reference of the rule in
docs/numerics.md "NVFP4" (each fp32 operation of the rule rounded to float32 once)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import make_mesh

import qmesh.jax as qj
from qmesh.jax.nvfp4 import Nvfp4Amax

F4 = ml_dtypes.float4_e2m1fn
E4M3 = ml_dtypes.float8_e4m3fn
FLT_MAX = np.float32(np.finfo(np.float32).max)


def unpack(data):
    data = np.asarray(data)
    out = np.empty((data.shape[0], 2 * data.shape[1]), np.uint8)
    out[:, 0::2] = data & 0xF
    out[:, 1::2] = data >> 4
    return out


def e2m1_codes(y):
    """float4_e2m1fn codes of float32 y (ml_dtypes rounds to nearest even and saturates)."""
    return np.clip(y, -6, 6).astype(F4).view(np.uint8)


def hadamard16(v, signs):
    """(1/4) H diag(d) of every 16 consecutive elements of the rows of float32 v, summed in
    float32 in the order of docs/design/nvfp4.md."""
    blocks = v.reshape(v.shape[0], -1, 16)
    out = np.empty_like(blocks)
    for i in range(16):
        acc = np.zeros(blocks.shape[:2], np.float32)
        for j in range(16):
            negative = (bin(i & j).count("1") + (signs >> j)) & 1
            acc = acc + (-blocks[..., j] if negative else blocks[..., j])
        out[..., i] = acc * np.float32(0.25)
    return out.reshape(v.shape)


def reference(v, tiles=False):
    """(codes, scale codes, scale_inv) of one copy of float32 v [rows, cols]."""
    rows, cols = v.shape
    amax = np.abs(v).reshape(rows, cols // 16, 16).max(-1)
    if tiles:
        tile = amax.reshape(rows // 16, 16, cols // 16).max(1)
        amax = np.repeat(tile, 16, axis=0)
    g = amax.max()
    enc = np.float32(1) if not 0 < g <= FLT_MAX else min(np.float32(2688 / np.float64(g)), FLT_MAX)
    t = np.float32(enc * np.float32(1 / np.float32(6)))
    s = np.minimum(amax * t, FLT_MAX).astype(np.float32)
    scale = np.minimum(s, np.float32(448)).astype(E4M3)
    dec = np.float32(1) / enc
    with np.errstate(divide="ignore"):
        factor = np.minimum(np.float32(1) / (scale.astype(np.float32) * dec), FLT_MAX)
    with np.errstate(over="ignore"):  # a zero scale: factor FLT_MAX, codes saturate
        y = (v * np.repeat(factor, 16, axis=1)).astype(np.float32)
    return e2m1_codes(y), scale.view(np.uint8), np.float32(dec)


def check_copy(got, want):
    data, scale, scale_inv = got
    codes, scales, dec = want
    np.testing.assert_array_equal(unpack(data), codes)
    np.testing.assert_array_equal(np.asarray(scale).view(np.uint8), scales)
    assert np.asarray(scale_inv).view(np.uint32)[0] == np.array(dec).view(np.uint32)


def test_e2m1_encoding_matches_ml_dtypes():
    # Every bf16 pattern with |x| <= 6 and every fp32 within 2048 ulps of each E2M1 value and
    # midpoint, in blocks [6, 15 values] of a tensor whose amax is 2688: the per-tensor encode
    # scale is 1 and every block's scale 1, so the codes are the E2M1 encodings of the values.
    bf16 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    points = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6], np.float32)
    near = (points.view(np.int32)[:, None] + np.arange(-2048, 2049)[None, :]).astype(np.int32)
    values = np.concatenate([bf16, near.view(np.float32).ravel()])
    values = values[np.abs(values) <= 6]
    values = np.concatenate([values, -values])
    values = np.pad(values, (0, -len(values) % 15))
    blocks = values.reshape(-1, 15)
    x = np.concatenate([np.full((len(blocks), 1), 6, np.float32), blocks], axis=1)
    x = np.concatenate([x, np.full((1, 16), 2688, np.float32)])
    x = np.pad(x, ((0, -len(x) % 256), (0, 0))).reshape(-1, 256)
    data, scale, scale_inv, *_ = qj.nvfp4_quantize(x)
    assert float(scale_inv[0]) == 1.0
    codes = unpack(data).reshape(-1, 16)[: len(blocks), 1:]
    np.testing.assert_array_equal(codes, e2m1_codes(blocks))
    decoded = qj.nvfp4_dequantize(data, scale, scale_inv).reshape(-1, 16)[: len(blocks), 1:]
    np.testing.assert_array_equal(decoded, codes.view(F4).astype(np.float32))


def test_scale_encoding_matches_ml_dtypes(rng):
    # Block amaxes over the whole E4M3 range (scale = amax / 6 with a per-tensor scale of 1).
    amax = np.exp2(rng.uniform(-20, np.log2(2688), 4095)).astype(np.float32)
    amax = np.concatenate([amax, [2688]]).astype(np.float32)
    x = np.zeros((len(amax), 16), np.float32)
    x[:, 5] = amax
    _, scale, *_ = qj.nvfp4_quantize(x.reshape(-1, 256))
    want = (amax * np.float32(1 / np.float32(6))).astype(np.float32).astype(E4M3)
    np.testing.assert_array_equal(np.asarray(scale).ravel().view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("tiles", [False, True])
def test_quantize_matches_the_rule(rng, dtype, tiles):
    x = (rng.standard_normal((64, 96)) * np.exp2(rng.integers(-8, 8, (64, 96)))).astype(dtype)
    x[0, :16] = 0  # a zero block
    out = jax.jit(lambda x: qj.nvfp4_quantize(x, columnwise=True, tiles_2d=tiles))(x)
    v = np.asarray(x).astype(np.float32)
    check_copy(out[:3], reference(v, tiles))
    check_copy(out[3:], reference(v.T.copy(), tiles))
    back = qj.nvfp4_dequantize(*out[:3])
    codes, scales, dec = reference(v, tiles)
    want = codes.view(F4).astype(np.float32) * np.repeat(
        scales.view(E4M3).astype(np.float32), 16, 1
    )
    np.testing.assert_array_equal(back, want * dec)


def test_rht_copy_is_the_quantized_transform(rng):
    x = rng.standard_normal((32, 48)).astype(np.float32)
    x[3, 7] = 1e6
    out = qj.nvfp4_quantize(x, columnwise=True, rht=True, rht_signs=0xB00F)
    check_copy(out[:3], reference(x))
    check_copy(out[3:], reference(hadamard16(x.T.copy(), 0xB00F)))


def test_amax_is_each_copys_own(rng):
    """Nvfp4Amax (what a sharded cast reduces): max |x|, and of the transformed columnwise copy
    with the RHT, to the bit; a NaN propagates."""
    x = rng.standard_normal((32, 48)).astype(np.float32)
    x[3, 7] = 1e6

    def amaxes(x, **options):
        return np.asarray(Nvfp4Amax.bind(jnp.asarray(x), **options)[0])

    transformed = np.abs(hadamard16(x.T.copy(), 0xB00F)).max()
    np.testing.assert_array_equal(amaxes(x, rht=True, rht_signs=0xB00F), [1e6, transformed])
    np.testing.assert_array_equal(amaxes(x, rht=False, rht_signs=0), [1e6, 1e6])
    assert transformed != np.float32(1e6)
    x[20, 40] = np.nan
    assert np.isnan(amaxes(x, rht=True, rht_signs=1)).all()


def test_stochastic_rounding(rng):
    x = np.full((256, 1024), 2.6, np.float32)
    x[:, ::16] = 6  # per-tensor and block scales 448: 2.6 lies between the codes of 2 and 3
    k1, k2 = jax.random.key(1), jax.random.key(2)
    a = qj.nvfp4_quantize(x, k1, stochastic_rounding=True, columnwise=True)
    b = qj.nvfp4_quantize(x, jax.random.key_data(k1), stochastic_rounding=True, columnwise=True)
    c = qj.nvfp4_quantize(x, k2, stochastic_rounding=True, columnwise=True)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)  # same key (typed or raw), same bits
    assert not np.array_equal(a[0], c[0])
    values = np.asarray(qj.nvfp4_dequantize(*a[:3]))
    mask = np.ones(x.shape, bool)
    mask[:, ::16] = False
    n = mask.sum()
    assert abs(values[mask].mean() - 2.6) < 5 * np.sqrt(0.6 * 0.4 / n)
    nearest = np.asarray(qj.nvfp4_dequantize(*qj.nvfp4_quantize(x)[:3]))
    assert abs(nearest[mask].mean() - 2.6) > 0.3


CASTS = {
    "blocks": dict(),
    "tiles": dict(tiles_2d=True),
    "sr": dict(stochastic_rounding=True),
    "rht": dict(rht=True, rht_signs=0x5A3C),
    "sr_rht": dict(stochastic_rounding=True, rht=True, rht_signs=0x5A3C),
}


def sharded_cast(x, spec, **options):
    """(x placed by `spec`, the jitted cast with both copies)."""
    sharded = jax.device_put(
        x, jax.sharding.NamedSharding(spec[0], jax.sharding.PartitionSpec(*spec[1:]))
    )
    return sharded, jax.jit(lambda x, k: qj.nvfp4_quantize(x, k, columnwise=True, **options))


@pytest.mark.parametrize("cast", CASTS)
def test_sharded_input_gives_the_unsharded_result(rng, mesh, cast):
    """Every cast is partitioned: each shard is quantized with the whole tensor's amaxes (one
    small all-reduce) at its place in the whole (stochastic rounding's bits), and nothing is
    gathered: the unsharded bits, a NaN in one shard included."""
    x = rng.standard_normal((128, 128)).astype(np.float32)  # 8 blocks each way: any mesh
    sharded, run = sharded_cast(x, (mesh, "dp", "tp"), **CASTS[cast])
    key = jax.random.key(3)
    for u, v in zip(run(sharded, key), run(x, key)):
        np.testing.assert_array_equal(u, v)
    x[100, 70] = np.nan  # in one shard: every shard's per-tensor scale as the unsharded one's
    for u, v in zip(run(jax.device_put(x, sharded.sharding), key), run(x, key)):
        np.testing.assert_array_equal(u, v)
    hlo = run.lower(sharded, key).compile().as_text()
    assert "all-gather" not in hlo and "all-reduce" in hlo


@pytest.mark.parametrize(
    "spec", [("dp", None), (None, "tp"), (("dp", "tp"), None), ("tp", "dp")], ids=str
)
def test_stochastic_rounding_and_rht_shards_sit_at_their_place(rng, spec):
    """Shards over rows, columns, both, and rows over two mesh axes (first major) round as their
    slices of the unsharded cast, in both copies."""
    x = rng.standard_normal((256, 128)).astype(np.float32) * 4  # blocks: a multiple of 8
    sharded, run = sharded_cast(x, (make_mesh((2, 4)), *spec), **CASTS["sr_rht"])
    key = jax.random.key(11)
    for u, v in zip(run(sharded, key), run(x, key)):
        np.testing.assert_array_equal(u, v)
    assert "all-gather" not in run.lower(sharded, key).compile().as_text()


def test_a_shard_that_cuts_a_block_is_refused(rng):
    x = jax.device_put(
        rng.standard_normal((64, 96)).astype(np.float32),
        jax.sharding.NamedSharding(make_mesh((2, 4)), jax.sharding.PartitionSpec(None, "tp")),
    )
    with pytest.raises(Exception, match="shards of 24, which is not a multiple of 16"):
        jax.jit(qj.nvfp4_quantize).lower(x).compile()


def test_vmap_quantizes_each_element_alone(rng):
    x = (
        rng.standard_normal((3, 16, 32)).astype(np.float32)
        * np.array([1, 100, 1e-3])[:, None, None]
    )
    out = jax.vmap(qj.nvfp4_quantize)(x)
    for b in range(3):
        for u, v in zip(out[:3], qj.nvfp4_quantize(x[b])[:3]):
            np.testing.assert_array_equal(np.asarray(u)[b], v)


def test_abstract_shapes():
    x = jax.ShapeDtypeStruct((32, 64), jnp.bfloat16)
    outs = jax.eval_shape(lambda x: qj.nvfp4_quantize(x, columnwise=True), x)
    assert [(o.shape, o.dtype) for o in outs] == [
        ((32, 32), jnp.uint8),
        ((32, 4), jnp.float8_e4m3fn),
        ((1,), jnp.float32),
        ((64, 16), jnp.uint8),
        ((64, 2), jnp.float8_e4m3fn),
        ((1,), jnp.float32),
    ]
    assert [o.shape for o in jax.eval_shape(qj.nvfp4_quantize, x)[3:]] == [(0,)] * 3


def test_clear_errors():
    with pytest.raises(ValueError, match="pad it to multiples of 16"):
        qj.nvfp4_quantize(np.zeros((24, 32), np.float32))
    with pytest.raises(ValueError, match="needs a key"):
        qj.nvfp4_quantize(np.zeros((16, 16), np.float32), stochastic_rounding=True)
    with pytest.raises(ValueError, match="turn one of rht and tiles_2d off"):
        qj.nvfp4_quantize(np.zeros((16, 16), np.float32), rht=True, tiles_2d=True)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        qj.nvfp4_quantize(np.zeros((16, 16), np.int32))
    data, scale, scale_inv, *_ = qj.nvfp4_quantize(np.ones((16, 32), np.float32))
    with pytest.raises(ValueError, match="takes one copy"):
        qj.nvfp4_dequantize(data, scale[:, :1], scale_inv)
