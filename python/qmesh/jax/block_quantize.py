"""Block-scaled FP8 quantization primitives (the Float8BlockScaling recipe,
docs/design/block_scaling.md): block quantize (optionally with the columnwise copy), block
dbias + quantize and block dequantize, each running qmesh's C++ op on every device's shard.

x is 2-D [R, C]. `block` is 1 (1x128 blocks: every 128 consecutive elements of a row) or 2
(128x128 tiles). Every block has its own current scale from its own amax; x ~= code *
scale_inv[block]. The scales are float32 in the layout cuBLASLt reads
(include/qmesh/block_quantized_tensor.h), given by `block_scale_shape`:

    1x128:   [ceil(C/128), round_up(R, 4)]            scale_inv[kb, r]
    128x128: [ceil(R/128), round_up(ceil(C/128), 4)]  scale_inv[rb, cb]

(padding zero). The columnwise copy q_t [C, R] is the transpose, block-scaled on its own rows
(with 1x128 blocks: 128x1 blocks of x), with scale_inv_t = block_scale_shape(C, R, block).

Sharding: codes keep x's sharding (q_t the transposed one) and each scale tensor is sharded
with its data: for 1x128 scales the blocks of a row (C / 128) follow x's columns and the rows
follow x's rows; for 128x128 scales the tile rows follow x's rows and the tile columns x's
columns. A shard boundary must not cut a block: a sharded dimension that is cut into
128-blocks must give shards that are multiples of 128. The padded dimension of a scale tensor
(the rows of 1x128 scales, the tile columns of 128x128 scales) may be sharded when the global
tensor has no padding there (R, or ceil(C/128), a multiple of 4): each device then holds its
shard's scales unpadded, and the ops pad them to the layout of their local shape (zeros)
before they call the C++ op. Any other sharding raises ValueError naming the dimension
(replicate it, or shard it so). No amax is shared between devices: block scaling issues no
collective (the bias gradient is summed over the axes of g's rows).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qmesh.jax.common import (
    F32,
    axes_of,
    check_fp8,
    check_wide,
    entry,
    even_spec,
    named,
)
from qmesh.jax.primitive import Op, register

BLOCK = 128  # the block edge
ALIGN = 4  # scale rows are padded to a multiple of this many floats
BLOCK_SHAPES = {1: "1x128", 2: "128x128"}


def check_block(block) -> int:
    """The block dim (1: 1x128, 2: 128x128); ValueError for anything else."""
    if isinstance(block, bool) or block not in BLOCK_SHAPES:
        raise ValueError(f"block must be 1 (1x128 blocks) or 2 (128x128 tiles), not {block!r}")
    return int(block)


def block_scale_shape(rows: int, cols: int, block: int) -> tuple[int, int]:
    """The shape of the scale_inv tensor of a [rows, cols] tensor with `block` blocks."""
    ceil = -(-cols // BLOCK)
    if check_block(block) == 1:
        return ceil, -(-rows // ALIGN) * ALIGN
    return -(-rows // BLOCK), -(-ceil // ALIGN) * ALIGN


def _whole_blocks(mesh, axes, size, what):
    """Raises ValueError unless the shards of `size` over `axes` are multiples of 128."""
    count = math.prod(dict(zip(mesh.axis_names, mesh.devices.shape))[a] for a in axes)
    if axes and (size // count) % BLOCK:
        raise ValueError(
            f"{what} ({size}) is sharded over {axes} into shards of {size // count}, which "
            f"is not a multiple of {BLOCK}: a shard boundary would cut a scaling block. Shard "
            f"it into multiples of {BLOCK}, or replicate it"
        )


def _unpadded(axes, count, multiple, what):
    """Raises ValueError if the padded scale dimension holding `count` scales is sharded
    (over `axes`) while the global scale tensor pads it; `multiple`: the size that avoids it."""
    if axes and count % ALIGN:
        raise ValueError(
            f"{what} is sharded over {axes}, but its {count} scales are padded to a multiple "
            f"of {ALIGN} in the scale layout, which cannot be split with the data: make it a "
            f"multiple of {multiple}, or replicate it"
        )


def block_scale_spec(mesh, shape, block, row_axes, col_axes, what):
    """The PartitionSpec entries of the scales of a [rows, cols] block-scaled tensor sharded
    as (row_axes, col_axes), after checking that the sharding cuts no block and that the
    padded scale dimension is not padded where it is sharded (see above)."""
    rows, cols = shape
    _whole_blocks(mesh, col_axes, cols, f"{what}: the columns")
    if block == 1:
        _unpadded(row_axes, rows, ALIGN, f"{what}: the rows (padded in 1x128 scales)")
        return entry(col_axes), entry(row_axes)
    _whole_blocks(mesh, row_axes, rows, f"{what}: the rows")
    _unpadded(
        col_axes, -(-cols // BLOCK), ALIGN * BLOCK, f"{what}: the columns (padded in tile scales)"
    )
    return entry(row_axes), entry(col_axes)


def unpad_scales(scale_inv, shape, block):
    """A device's scales of its [rows, cols] shard without the layout's padding."""
    used = shape[0] if block == 1 else -(-shape[1] // BLOCK)
    return scale_inv[:, :used]


def pad_scales(scale_inv, shape, block):
    """A device's scales of its [rows, cols] shard in the layout of that shape (the padding
    that unpad_scales took off, as zeros); unchanged when they are in it."""
    want = block_scale_shape(*shape, block)
    missing = want[1] - scale_inv.shape[1]
    return jnp.pad(scale_inv, ((0, 0), (0, missing))) if missing > 0 else scale_inv


def expand_scales(scale_inv, rows: int, cols: int, block: int):
    """The scale_inv of every element of a [rows, cols] block-scaled tensor, [rows, cols]."""
    if block == 1:
        per_block = scale_inv[:, :rows].T  # [rows, ceil(C/128)]
        return jnp.repeat(per_block, BLOCK, axis=1)[:, :cols]
    tiles = scale_inv[:, : -(-cols // BLOCK)]
    return jnp.repeat(jnp.repeat(tiles, BLOCK, axis=0), BLOCK, axis=1)[:rows, :cols]


# ---- block quantize and block dbias + quantize ------------------------------------------------


def _check_x(x, what):
    check_wide(x.dtype, what)
    if x.ndim != 2:
        raise ValueError(
            f"block quantize takes {what} as [rows, cols], not shape {tuple(x.shape)}: "
            "reshape it to 2-D first"
        )


def _block_avals(x, *, out_dtype, block, columnwise):
    """(q, scale_inv, q_t, scale_inv_t) of block-quantizing x (the last two empty without the
    columnwise copy)."""
    _check_x(x, "x")
    out_dtype = check_fp8(out_dtype)
    rows, cols = x.shape
    outs = [
        jax.core.ShapedArray(x.shape, out_dtype),
        jax.core.ShapedArray(block_scale_shape(rows, cols, block), F32),
    ]
    if columnwise:
        outs += [
            jax.core.ShapedArray((cols, rows), out_dtype),
            jax.core.ShapedArray(block_scale_shape(cols, rows, block), F32),
        ]
    else:
        outs += [jax.core.ShapedArray((0,), out_dtype), jax.core.ShapedArray((0,), F32)]
    return outs


def _scale_zeros(x, **params):
    """The zero-filled buffers the handler's scale results alias (their padding stays 0)."""
    _, s, _, s_t = _block_avals(x, **params)
    return jnp.zeros(s.shape, F32), jnp.zeros(s_t.shape, F32)


def _block_shardings(mesh, x_info, block, columnwise):
    """Shardings of (x, q, scale_inv, q_t, scale_inv_t) for x's sharding, and x's row axes."""
    spec = even_spec(mesh, x_info)
    rows, cols = axes_of(spec[0]), axes_of(spec[1])
    shape = tuple(x_info.shape)
    scale = named(mesh, *block_scale_spec(mesh, shape, block, rows, cols, "block quantize: x"))
    outs = [named(mesh, *spec), scale, named(mesh), named(mesh)]
    if columnwise:
        outs[2] = named(mesh, spec[1], spec[0])
        outs[3] = named(
            mesh,
            *block_scale_spec(
                mesh, shape[::-1], block, cols, rows, "block quantize: the columnwise copy of x"
            ),
        )
    return named(mesh, *spec), outs, rows


def _block_rule(columnwise):
    """The Shardy rule's results: codes follow x; the scales' dimensions are factors of their
    own (the `shardings` callback shards them with their data)."""
    return "i j, s0 s1, j i, t0 t1" if columnwise else "i j, s0 s1, z, t"


class _BlockCast(Op):
    """What block quantize and block dbias + quantize share: x -> (q, scale_inv, q_t,
    scale_inv_t[, ...]); the inner primitive also takes the two zero-filled scale buffers."""

    num_inputs = 1
    static_params = ("out_dtype", "block", "columnwise", "power_2_scale", "amax_epsilon")
    output_aliases = {1: 1, 2: 3}

    @classmethod
    def abstract(cls, x, *zeros, out_dtype, block, columnwise, **scaling):
        return tuple(
            _block_avals(x, out_dtype=out_dtype, block=check_block(block), columnwise=columnwise)
        )

    @classmethod
    def attributes(cls, *, block, power_2_scale, amax_epsilon, **_):
        return dict(
            block=np.int32(block),
            power_2_scale=bool(power_2_scale),
            amax_epsilon=np.float32(amax_epsilon),
        )

    @classmethod
    def is_empty(cls, x, *zeros, **params):
        return x.size == 0

    @classmethod
    def empty(cls, x, *zeros, out_dtype, block, columnwise, **_):
        avals = _block_avals(x, out_dtype=out_dtype, block=block, columnwise=columnwise)
        return tuple(jnp.zeros(a.shape, a.dtype) for a in avals)

    @classmethod
    def local(cls, plan, x, **params):
        """plan: (unpad the scales, unpad the columnwise copy's scales), or None."""
        block = params["block"]
        sizes = dict(out_dtype=params["out_dtype"], block=block)
        zeros = _scale_zeros(x, columnwise=params["columnwise"], **sizes)
        q, s, q_t, s_t, *rest = cls.inner.bind(x, *zeros, **params)
        unpad, unpad_t = plan or (False, False)
        if unpad:
            s = unpad_scales(s, x.shape, block)
        if unpad_t:
            s_t = unpad_scales(s_t, x.shape[::-1], block)
        return (q, s, q_t, s_t, *rest)

    @classmethod
    def _plan(cls, mesh, x_info, block, columnwise):
        rows, cols = even_spec(mesh, x_info)
        unpad = bool(axes_of(rows if block == 1 else cols))
        unpad_t = columnwise and bool(axes_of(cols if block == 1 else rows))
        return unpad, unpad_t

    @classmethod
    def shardings(cls, mesh, arg_infos, *, block, columnwise, **_):
        x, outs, _ = _block_shardings(mesh, arg_infos[0], block, columnwise)
        return (x,), outs, cls._plan(mesh, arg_infos[0], block, columnwise)

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, columnwise, **_):
        return f"i j -> {_block_rule(columnwise)}"


@register
class BlockQuantize(_BlockCast):
    """x -> (q, scale_inv, q_t, scale_inv_t)."""

    name, target = "qmesh_block_quantize", "qmesh_block_quantize"


@register
class BlockDbiasQuantize(_BlockCast):
    """g -> (q, scale_inv, q_t, scale_inv_t, dbias): block quantize of an output gradient and
    its bias gradient dbias[c] = sum over rows of g[r, c] (float32 [cols]) in the same pass."""

    name, target = "qmesh_block_dbias_quantize", "qmesh_block_dbias_quantize"

    @classmethod
    def abstract(cls, g, *zeros, **params):
        outs = super().abstract(g, *zeros, **params)
        return (*outs, jax.core.ShapedArray((g.shape[1],), F32))

    @classmethod
    def empty(cls, g, *zeros, **params):
        return (*super().empty(g, **params), jnp.zeros((g.shape[1],), F32))

    @classmethod
    def local(cls, plan, g, **params):
        """plan: (the _BlockCast plan, the mesh axes of g's rows), or None."""
        *outs, dbias = super().local(plan and plan[0], g, **params)
        return (*outs, lax.psum(dbias, plan[1]) if plan and plan[1] else dbias)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, block, columnwise, **_):
        g, outs, rows = _block_shardings(mesh, arg_infos[0], block, columnwise)
        dbias = named(mesh, g.spec[1] if len(g.spec) > 1 else None)
        return (g,), (*outs, dbias), (cls._plan(mesh, arg_infos[0], block, columnwise), rows)

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, columnwise, **_):
        return f"i j -> {_block_rule(columnwise)}, j"


# ---- block dequantize -------------------------------------------------------------------------


@register
class BlockDequantize(Op):
    """(q, scale_inv) -> code * scale_inv of its block, in `out_dtype`."""

    name, target, num_inputs = "qmesh_block_dequantize", "qmesh_block_dequantize", 2
    static_params = ("block", "out_dtype")

    @classmethod
    def abstract(cls, q, scale_inv, *, block, out_dtype):
        check_fp8(q.dtype)
        if q.ndim != 2:
            raise ValueError(f"block dequantize takes q as [rows, cols], not shape {q.shape}")
        check_scale_inv(scale_inv, q.shape, check_block(block), "scale_inv")
        return (jax.core.ShapedArray(q.shape, check_wide(out_dtype, "out_dtype")),)

    @classmethod
    def attributes(cls, *, block, **_):
        return dict(block=np.int32(block))

    @classmethod
    def is_empty(cls, q, scale_inv, **params):
        return q.size == 0

    @classmethod
    def empty(cls, q, scale_inv, *, out_dtype, **_):
        return (jnp.zeros(q.shape, out_dtype),)

    @classmethod
    def local(cls, plan, q, scale_inv, **params):
        return cls.inner.bind(q, pad_scales(scale_inv, q.shape, params["block"]), **params)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, block, **_):
        spec = even_spec(mesh, arg_infos[0])
        rows, cols = axes_of(spec[0]), axes_of(spec[1])
        scale = block_scale_spec(
            mesh, tuple(arg_infos[0].shape), block, rows, cols, "block dequantize: q"
        )
        q = named(mesh, *spec)
        return (q, named(mesh, *scale)), (q,), None

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return "i j, s0 s1 -> i j"


def check_scale_inv(scale_inv, shape, block, what):
    """Raises ValueError unless scale_inv is float32 of block_scale_shape(*shape, block)."""
    want = block_scale_shape(*shape, block)
    if scale_inv.dtype != F32 or tuple(scale_inv.shape) != want:
        raise ValueError(
            f"{what} of a {list(shape)} tensor in {BLOCK_SHAPES[block]} blocks must be "
            f"float32{list(want)} (block_scale_shape), not {scale_inv.dtype}"
            f"{list(scale_inv.shape)}"
        )


# ---- the functions users call -----------------------------------------------------------------


def block_quantize(
    x,
    out_dtype=jnp.float8_e4m3fn,
    *,
    block: int = 1,
    columnwise: bool = False,
    power_2_scale: bool = True,
    amax_epsilon: float = 0.0,
):
    """Block-quantizes x [R, C] -> (q, scale_inv, q_t, scale_inv_t): codes [R, C] with the
    scales in block_scale_shape(R, C, block), and, if `columnwise`, the transpose q_t [C, R]
    with block_scale_shape(C, R, block) (else two empty arrays). power_2_scale and
    amax_epsilon are the QParams of the operand (qmesh.jax.recipe.QParams)."""
    return BlockQuantize.bind(
        jnp.asarray(x), **_cast_params(out_dtype, block, columnwise, power_2_scale, amax_epsilon)
    )


def block_dbias_quantize(
    g,
    out_dtype=jnp.float8_e4m3fn,
    *,
    block: int = 1,
    columnwise: bool = False,
    power_2_scale: bool = True,
    amax_epsilon: float = 0.0,
):
    """block_quantize of g [R, C] plus dbias = g.sum(0) in float32 [C]: (q, scale_inv, q_t,
    scale_inv_t, dbias)."""
    return BlockDbiasQuantize.bind(
        jnp.asarray(g), **_cast_params(out_dtype, block, columnwise, power_2_scale, amax_epsilon)
    )


def block_dequantize(q, scale_inv, *, block: int = 1, out_dtype=jnp.float32):
    """code * scale_inv of its block for q [R, C] (rowwise codes) in out_dtype."""
    return BlockDequantize.bind(
        jnp.asarray(q),
        jnp.asarray(scale_inv),
        block=check_block(block),
        out_dtype=check_wide(out_dtype, "out_dtype"),
    )[0]


def _cast_params(out_dtype, block, columnwise, power_2_scale, amax_epsilon):
    if not (amax_epsilon >= 0 and amax_epsilon != float("inf")):
        raise ValueError(f"amax_epsilon must be finite and >= 0, not {amax_epsilon}")
    return dict(
        out_dtype=check_fp8(out_dtype),
        block=check_block(block),
        columnwise=bool(columnwise),
        power_2_scale=bool(power_2_scale),
        amax_epsilon=float(amax_epsilon),
    )
