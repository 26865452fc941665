"""NVFP4 quantization primitives (docs/design/nvfp4.md): quantize and dequantize, each running
qmesh's C++ op (include/qmesh/ops/nvfp4_quantize.h) through its XLA FFI handler.

x is 2-D [R, C], R and C multiples of 16 (pad first). One copy of the quantized tensor is

    data       uint8 [R, C // 2]           two float4_e2m1fn codes per byte, element 2k in the
                                           low nibble (bits 0-3), 2k + 1 in the high nibble
    scale      float8_e4m3fn [R, C // 16]  the decode scale of 16 consecutive elements of a row
    scale_inv  float32 [1]                 the per-tensor decode scale

and x[r, c] ~= e2m1(code) * scale[r, c // 16] * scale_inv. With `columnwise` the quantize also
returns the copy of x.T ([C, R]; with `rht`, of the random Hadamard transform of its 16-element
blocks), else three empty arrays. `tiles_2d` gives one scale per 16x16 tile (repeated on the
tile's 16 rows). Stochastic rounding (`stochastic_rounding`) takes its seed from `key`, a
jax.random key (typed, or raw uint32 [2] key data): the same key gives the same bits on the host
and on a GPU, and a Flax rng stream can feed it.

Sharding. Every quantize is partitioned, stochastic rounding and the RHT included, so that
each device's codes and scales are bit for bit its slice of the unsharded cast's
(docs/design/nvfp4.md "Sharding"). Each device takes its shard's own amaxes (Nvfp4Amax, the C++
nvfp4_amax: of x, and of the transformed columnwise copy with the RHT, by the cast's own
arithmetic), all-reduces them (max, with a NaN flag apart) over x's mesh axes, and casts its
shard with them (NvFp4Options::amax, columnwise_amax) at its place in the whole tensor
(NvFp4Options::origin: lax.axis_index of the mesh axes of each dimension times the shard's
extent; whole_rows, whole_cols: the global shape), so stochastic rounding draws the bits of
each element's index in the whole tensor. The key is replicated. The copies keep x's sharding
(the columnwise copy transposed) and a sharding whose shards are not whole 1x16 blocks (with
the columnwise copy or 16x16 tiles: along both dimensions) is refused with a ValueError.
Nothing of x is gathered. Dequantize runs unpartitioned.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qmesh.jax.block_quantize import sized
from qmesh.jax.common import F32, axes_of, check_wide, even_spec, named
from qmesh.jax.operand_checks import check_matrix, check_whole_blocks
from qmesh.jax.primitive import Op, register

BLOCK = 16  # elements per E4M3 scale
U8 = jnp.dtype(jnp.uint8)
E4M3 = jnp.dtype(jnp.float8_e4m3fn)
I32 = jnp.dtype(jnp.int32)


def _check_shape(shape, what):
    check_matrix(shape, what, "nvfp4", multiple=BLOCK, positive=True)


def _copy_avals(rows, cols):
    return [
        jax.core.ShapedArray((rows, cols // 2), U8),
        jax.core.ShapedArray((rows, cols // BLOCK), E4M3),
        jax.core.ShapedArray((1,), F32),
    ]


def _replicated(mesh, arg_infos, outs):
    return [named(mesh)] * len(arg_infos), [named(mesh)] * len(outs), None


def cast_attributes(*, stochastic_rounding, tiles_2d, rht, rht_signs, **_):
    """The FFI attributes of the cast options (the plain and the grouped quantize)."""
    return dict(
        stochastic_rounding=bool(stochastic_rounding),
        tiles_2d=bool(tiles_2d),
        rht=bool(rht),
        rht_signs=np.int32(rht_signs),
    )


class Placement(NamedTuple):
    """Where a device's shard of x sits: the mesh axes x's rows and columns are sharded over
    (first axis major, as in a PartitionSpec) and x's whole shape."""

    row_axes: tuple[str, ...]
    col_axes: tuple[str, ...]
    shape: tuple[int, int]


@register
class Nvfp4Quantize(Op):
    """(x, key words int32 [2]) -> (data, scale, scale_inv, data_t, scale_t, scale_inv_t)."""

    name, target, num_inputs = "qmesh_nvfp4_quantize", "qmesh_nvfp4_quantize", 2
    static_params = ("columnwise", "stochastic_rounding", "tiles_2d", "rht", "rht_signs")

    @classmethod
    def abstract(cls, x, key, *, columnwise, **_):
        check_wide(x.dtype, "nvfp4_quantize: x")
        _check_shape(x.shape, "x")
        if key.dtype != I32 or key.shape != (2,):
            raise TypeError(f"nvfp4_quantize: the key words must be int32[2], not {key}")
        rows, cols = x.shape
        outs = _copy_avals(rows, cols)
        if columnwise:
            return tuple(outs + _copy_avals(cols, rows))
        return tuple(outs + [jax.core.ShapedArray((0,), a.dtype) for a in outs])

    @classmethod
    def attributes(cls, *, whole_rows, whole_cols, **params):
        return dict(
            cast_attributes(**params),
            whole_rows=np.int64(whole_rows),
            whole_cols=np.int64(whole_cols),
        )

    @classmethod
    def inner_abstract(cls, x, key, amax, columnwise_amax, origin, **params):
        """The handler also takes, when x is a shard of a whole [whole_rows, whole_cols]
        tensor, the whole tensor's amaxes (float32 [1]: rowwise, transformed columnwise) and
        x's origin in it (int32 [2]); each [0] (and the shape 0, 0) when x is the whole."""
        return cls.abstract(x, key, **params)

    @classmethod
    def is_empty(cls, *avals, **params):
        return False  # abstract refuses an x without elements

    @classmethod
    def local(cls, plan: Placement | None, x, key, **params):
        """plan: where x's shard sits in the whole tensor, or None (x is the whole)."""
        none = jnp.zeros((0,), F32)
        if not plan:
            origin = jnp.zeros((0,), I32)
            return cls.inner.bind(x, key, none, none, origin, whole_rows=0, whole_cols=0, **params)
        # The whole tensor's amaxes: the shards' own (nvfp4_amax, the cast's own arithmetic)
        # reduced (max), with a NaN flag apart since XLA's max may drop a NaN.
        (own,) = Nvfp4Amax.inner.bind(x, rht=params["rht"], rht_signs=params["rht_signs"])
        nan = jnp.isnan(own)
        reduced = lax.pmax(
            jnp.concatenate([jnp.where(nan, 0.0, own), nan.astype(F32)]),
            plan.row_axes + plan.col_axes,
        )
        amaxes = jnp.where(reduced[2:] > 0, jnp.nan, reduced[:2])
        transformed = params["rht"] and params["columnwise"]
        # x's first row and column: its shard's index along each dimension times its size.
        dims = zip((plan.row_axes, plan.col_axes), x.shape)
        origin = jnp.stack([lax.axis_index(a) * n if a else 0 for a, n in dims]).astype(I32)
        return cls.inner.bind(
            x,
            key,
            amaxes[:1],
            amaxes[1:] if transformed else none,
            origin,
            whole_rows=plan.shape[0],
            whole_cols=plan.shape[1],
            **params,
        )

    @classmethod
    def shardings(cls, mesh, arg_infos, *, columnwise, tiles_2d, **params):
        x = arg_infos[0]
        spec = even_spec(mesh, x)
        rows, cols = x.shape
        check_whole_blocks(
            mesh, axes_of(spec[1]), cols, BLOCK, "nvfp4_quantize: x's columns", "a 1x16 block"
        )
        if columnwise or tiles_2d:
            cut = "a 16x16 tile" if tiles_2d else "a 1x16 block of the columnwise copy"
            check_whole_blocks(mesh, axes_of(spec[0]), rows, BLOCK, "nvfp4_quantize: x's rows", cut)
        data, one = named(mesh, *spec), named(mesh)
        copy_t = named(mesh, spec[1], spec[0]) if columnwise else one
        plan = Placement(axes_of(spec[0]), axes_of(spec[1]), (rows, cols))
        sharded = plan.row_axes or plan.col_axes
        return [data, one], [data, data, one, copy_t, copy_t, one], plan if sharded else None

    @classmethod
    def mesh_sharding_rule(cls, mesh, value_types, result_types, *, columnwise, **params):
        devices = math.prod(mesh.shape.values())
        dims, sizes = {}, {}
        for name, size in zip("ij", value_types[0].shape):
            blocks = size // BLOCK
            if blocks > 1 and blocks % devices == 0:  # sharded in whole blocks, as the copies
                dims[name] = (f"({name}b {name}e)", f"({name}b {name}p)", f"{name}b")
                sizes.update({f"{name}b": blocks, f"{name}e": BLOCK, f"{name}p": BLOCK // 2})
            else:  # the callbacks shard (or refuse to cut) the blocks; the partitioner moves
                dims[name] = (name, f"{name}p", f"{name}b")
        (i, i_packed, i_blocks), (j, j_packed, j_blocks) = dims["i"], dims["j"]
        t = f"{j} {i_packed}, {j} {i_blocks}, f" if columnwise else "g, h, l"
        return sized(f"{i} {j}, k -> {i} {j_packed}, {i} {j_blocks}, e, {t}", sizes)


@register
class Nvfp4Amax(Op):
    """x -> float32 [2]: the per-tensor amaxes the quantize takes of x's own values for the
    rowwise and the columnwise copy (of the transformed values with `rht`), NaN-propagating
    (the C++ op nvfp4_amax): what a partitioned quantize reduces over the shards."""

    name, target, num_inputs = "qmesh_nvfp4_amax", "qmesh_nvfp4_amax", 1
    static_params = ("rht", "rht_signs")

    @classmethod
    def abstract(cls, x, **_):
        check_wide(x.dtype, "nvfp4_amax: x")
        _check_shape(x.shape, "x")
        return (jax.core.ShapedArray((2,), F32),)

    @classmethod
    def attributes(cls, *, rht, rht_signs):
        return dict(rht=bool(rht), rht_signs=np.int32(rht_signs))


@register
class Nvfp4Dequantize(Op):
    """(data, scale, scale_inv) -> the copy's values [rows, cols] in `out_dtype`."""

    name, target, num_inputs = "qmesh_nvfp4_dequantize", "qmesh_nvfp4_dequantize", 3
    static_params = ("out_dtype",)

    @classmethod
    def abstract(cls, data, scale, scale_inv, *, out_dtype):
        rows, cols = (data.shape[0], 2 * data.shape[1]) if data.ndim == 2 else (0, 0)
        want = _copy_avals(rows, cols) if data.ndim == 2 else []
        got = [jax.core.ShapedArray(a.shape, a.dtype) for a in (data, scale, scale_inv)]
        if data.ndim != 2 or got != want:
            raise ValueError(
                "nvfp4_dequantize takes one copy (data uint8[rows, cols // 2], scale "
                "float8_e4m3fn[rows, cols // 16], scale_inv float32[1]), not "
                f"{', '.join(str(g) for g in got)}"
            )
        _check_shape((rows, cols), "the copy")
        return (jax.core.ShapedArray((rows, cols), check_wide(out_dtype, "out_dtype")),)

    @classmethod
    def shardings(cls, mesh, arg_infos, **params):
        return _replicated(mesh, arg_infos, range(1))

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return ("i j, k l, m -> a b", {"need_replication_factors": ("i", "j", "k", "l")})


def key_words(key):
    """The int32 [2] operand of a jax.random key (typed or raw uint32 [2] key data)."""
    if jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    key = jnp.asarray(key)
    if key.shape != (2,) or key.dtype != jnp.uint32:
        raise TypeError(
            f"nvfp4_quantize: key must be a jax.random key or uint32[2] key data, not "
            f"{key.dtype}{list(key.shape)}"
        )
    return lax.bitcast_convert_type(key, jnp.int32)


def nvfp4_quantize(
    x,
    key=None,
    *,
    columnwise: bool = False,
    stochastic_rounding: bool = False,
    tiles_2d: bool = False,
    rht: bool = False,
    rht_signs: int = 0,
):
    """NVFP4-quantizes x [R, C] -> (data, scale, scale_inv, data_t, scale_t, scale_inv_t).
    `key` (needed with stochastic_rounding) seeds stochastic rounding: seed = key[0] << 32 |
    key[1]. rht_signs: the 16-bit sign mask of the transform (bit j set: column j of the
    Hadamard matrix negated); RHT applies to the columnwise copy and excludes tiles_2d."""
    words, params = quantize_options(
        "nvfp4_quantize", key, columnwise, stochastic_rounding, tiles_2d, rht, rht_signs
    )
    return Nvfp4Quantize.bind(jnp.asarray(x), words, **params)


def quantize_options(op, key, columnwise, stochastic_rounding, tiles_2d, rht, rht_signs):
    """(the key words operand, the static parameters) of an NVFP4 quantize `op`, checked."""
    if stochastic_rounding and key is None:
        raise ValueError(f"{op}: stochastic_rounding needs a key (jax.random.key(...))")
    if not 0 <= int(rht_signs) < 1 << 16:
        raise ValueError(f"{op}: rht_signs must be a 16-bit mask, not {rht_signs}")
    if rht and tiles_2d:
        raise ValueError(
            f"{op}: the random Hadamard transform is for 1x16 blocks (wgrad operands), "
            "not 16x16 tiles (weights): turn one of rht and tiles_2d off"
        )
    words = key_words(key) if key is not None else jnp.zeros((2,), jnp.int32)
    return words, dict(
        columnwise=bool(columnwise),
        stochastic_rounding=bool(stochastic_rounding),
        tiles_2d=bool(tiles_2d),
        rht=bool(rht),
        rht_signs=int(rht_signs),
    )


def nvfp4_dequantize(data, scale, scale_inv, *, out_dtype=jnp.float32):
    """(e2m1(code) * scale of its block) * scale_inv of one copy, [rows, cols] in out_dtype."""
    return Nvfp4Dequantize.bind(
        jnp.asarray(data),
        jnp.asarray(scale),
        jnp.asarray(scale_inv),
        out_dtype=check_wide(out_dtype, "out_dtype"),
    )[0]
