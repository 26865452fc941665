"""qmesh.jax.grouped_mxfp8_quantize / grouped_nvfp4_quantize: every group bit for bit the
non-grouped quantize of its rows (NVFP4 stochastic rounding with the documented per-group
seed, RHT), empty groups, and clear errors for bad splits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_mesh
from jax.sharding import NamedSharding, PartitionSpec

import qmesh.jax as qj

SIZES = [64, 0, 32, 96]  # whole 32-row (and 16-row) blocks, one group empty
COLS = 64


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


def groups_of(x):
    """(g, rows_g, x's rows of group g, first row) of every non-empty group of SIZES."""
    start = 0
    for g, rows in enumerate(SIZES):
        if rows:
            yield g, rows, x[start : start + rows], start
        start += rows


def wanted_key(key, g):
    """The key data of group g's seed, by the documented rule: seed + g * 0x9E3779B97F4A7C15."""
    words = np.asarray(jax.random.key_data(key), np.uint64)
    seed = (int(words[0]) << 32 | int(words[1])) + g * 0x9E3779B97F4A7C15
    return jnp.asarray([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], jnp.uint32)


@pytest.mark.parametrize(
    "dtype,fp8", [(jnp.bfloat16, jnp.float8_e4m3fn), (jnp.float32, jnp.float8_e5m2)]
)
def test_grouped_mxfp8_is_mxfp8_quantize_of_each_group(dtype, fp8):
    x = jax.random.normal(jax.random.key(1), (sum(SIZES), COLS), dtype) * 3
    sizes = jnp.asarray(SIZES, jnp.int32)
    f = jax.jit(lambda v, s: qj.grouped_mxfp8_quantize(v, s, fp8, columnwise=True, margin=1.0))
    q, scale, q_t, scale_t = f(x, sizes)
    assert q.shape == x.shape and scale.shape == (x.shape[0], COLS // 32)
    assert q_t.shape == (x.size,) and scale_t.shape == (x.size // 32,)
    for _, rows, part, start in groups_of(x):
        wq, ws, wq_t, ws_t = qj.mxfp8_quantize(part, fp8, columnwise=True, margin=1.0)
        np.testing.assert_array_equal(bits(q[start : start + rows]), bits(wq))
        np.testing.assert_array_equal(bits(scale[start : start + rows]), bits(ws))
        flat = slice(start * COLS, (start + rows) * COLS)
        np.testing.assert_array_equal(bits(q_t[flat]).reshape(COLS, rows), bits(wq_t))
        flat_s = slice(start * COLS // 32, (start + rows) * COLS // 32)
        np.testing.assert_array_equal(bits(scale_t[flat_s]).reshape(COLS, rows // 32), bits(ws_t))
    rowwise = qj.grouped_mxfp8_quantize(x, sizes, fp8, margin=1.0)
    assert rowwise[2].size == rowwise[3].size == 0
    np.testing.assert_array_equal(bits(rowwise[0]), bits(q))


@pytest.mark.parametrize(
    "options",
    [
        dict(stochastic_rounding=True, rht=True, rht_signs=0xB3C5),
        dict(tiles_2d=True),
    ],
)
def test_grouped_nvfp4_is_nvfp4_quantize_of_each_group(options):
    x = jax.random.normal(jax.random.key(2), (sum(SIZES), COLS), jnp.float32)
    x = x * jnp.arange(1, x.shape[0] + 1, dtype=jnp.float32)[:, None]  # amaxes differ per group
    sizes = jnp.asarray(SIZES, jnp.int32)
    key = jax.random.key(7)
    f = jax.jit(lambda v, s, k: qj.grouped_nvfp4_quantize(v, s, k, columnwise=True, **options))
    data, scale, scale_inv, data_t, scale_t, scale_inv_t = f(x, sizes, key)
    assert scale_inv.shape == scale_inv_t.shape == (len(SIZES),)
    assert float(scale_inv[1]) == float(scale_inv_t[1]) == 0.0  # the empty group
    for g, rows, part, start in groups_of(x):
        np.testing.assert_array_equal(
            bits(qj.grouped_scaled_quantize.group_key(key, g)), bits(wanted_key(key, g))
        )
        want = qj.nvfp4_quantize(part, wanted_key(key, g), columnwise=True, **options)
        got = (
            data[start : start + rows],
            scale[start : start + rows],
            scale_inv[g : g + 1],
            data_t[start * COLS // 2 : (start + rows) * COLS // 2].reshape(COLS, rows // 2),
            scale_t[start * COLS // 16 : (start + rows) * COLS // 16].reshape(COLS, rows // 16),
            scale_inv_t[g : g + 1],
        )
        for a, b in zip(got, want):
            np.testing.assert_array_equal(bits(a), bits(b))
    if options.get("stochastic_rounding"):  # group 0 rounds as the non-grouped op with `key`
        first = qj.nvfp4_quantize(x[:64], key, columnwise=True, **options)
        np.testing.assert_array_equal(bits(data[:64]), bits(first[0]))


def test_grouped_scaled_quantize_on_a_sharded_x():
    """A sharded x is gathered (the operands are replicated): the same bits as unsharded."""
    x = jax.random.normal(jax.random.key(3), (sum(SIZES), COLS), jnp.float32)
    sizes, key = jnp.asarray(SIZES, jnp.int32), jax.random.key(4)
    mesh = make_mesh((2, 2))
    xs = jax.device_put(x, NamedSharding(mesh, PartitionSpec("dp", "tp")))
    mx = jax.jit(lambda v, s: qj.grouped_mxfp8_quantize(v, s, columnwise=True))
    nv = jax.jit(
        lambda v, s, k: qj.grouped_nvfp4_quantize(
            v, s, k, columnwise=True, stochastic_rounding=True
        )
    )
    for f, args in ((mx, (sizes,)), (nv, (sizes, key))):
        for a, b in zip(f(xs, *args), f(x, *args)):
            np.testing.assert_array_equal(bits(a), bits(b))


def test_grouped_scaled_quantize_empty_inputs():
    x = jnp.zeros((0, COLS), jnp.float32)
    sizes = jnp.zeros(2, jnp.int32)
    q, s, q_t, s_t = qj.grouped_mxfp8_quantize(x, sizes, columnwise=True)
    assert q.shape == (0, COLS) and s.shape == (0, 2) and q_t.size == s_t.size == 0
    outs = qj.grouped_nvfp4_quantize(x, sizes, columnwise=True)
    assert outs[0].shape == (0, COLS // 2)
    np.testing.assert_array_equal(np.asarray(outs[2]), np.zeros(2, np.float32))


def test_grouped_scaled_quantize_clear_errors():
    x = jnp.ones((64, COLS), jnp.float32)
    mx = jax.jit(lambda v, g: qj.grouped_mxfp8_quantize(v, g))
    nv = jax.jit(lambda v, g: qj.grouped_nvfp4_quantize(v, g))
    with pytest.raises(Exception, match="group_sizes add up to 63 rows but x has 64 rows"):
        mx(x, np.asarray([32, 31], np.int32))[0].block_until_ready()
    with pytest.raises(Exception, match="group 0 has 48 rows, not a multiple of 32"):
        mx(x, np.asarray([48, 16], np.int32))[0].block_until_ready()
    with pytest.raises(Exception, match="group 1 has 8 rows, not a multiple of 16"):
        nv(x, np.asarray([48, 8, 8], np.int32))[0].block_until_ready()
    # With the columnwise copy too: a group of part of a block is named, not its scales' shape.
    for quantize, sizes, block in (
        (qj.grouped_mxfp8_quantize, [16, 48], 32),
        (qj.grouped_nvfp4_quantize, [8, 56], 16),
    ):
        cast = jax.jit(lambda v, g, quantize=quantize: quantize(v, g, columnwise=True))
        with pytest.raises(
            Exception, match=f"group 0 has {sizes[0]} rows, not a multiple of {block}"
        ):
            cast(x, np.asarray(sizes, np.int32))[0].block_until_ready()
    with pytest.raises(Exception, match="group_sizes add up to 80 rows but x has 64 rows"):
        nv(x, np.asarray([48, 32], np.int32))[0].block_until_ready()
    with pytest.raises(ValueError, match="no groups for 64 rows"):
        qj.grouped_nvfp4_quantize(x, np.zeros(0, np.int32))
    with pytest.raises(TypeError, match="group_sizes must be int32"):
        qj.grouped_mxfp8_quantize(x, np.asarray([64.0], np.float32))
    with pytest.raises(ValueError, match="multiples of 32"):
        qj.grouped_mxfp8_quantize(jnp.ones((64, 48)), np.asarray([64], np.int32))
    with pytest.raises(ValueError, match="needs a key"):
        qj.grouped_nvfp4_quantize(x, np.asarray([64], np.int32), stochastic_rounding=True)
