"""Block-scaled FP8 quantization primitives (the Float8BlockScaling recipe,
docs/design/block_scaling.md): block quantize (optionally with the columnwise copy), block
dbias + quantize and block dequantize, each running qmesh's C++ op on every device's shard.

x is 2-D [R, C]. `block` is 1 (1x128 blocks: every 128 consecutive elements of a row) or 2
(128x128 tiles). Every block has its own current scale from its own amax; x ~= code *
scale_inv[block]. In JAX the scales are float32, one per block, unpadded and in the order of
the blocks (`block_scale_shape`):

    1x128:   [R, ceil(C/128)]             scale_inv[r, kb]:  x[r, 128 kb : 128 kb + 128]
    128x128: [ceil(R/128), ceil(C/128)]   scale_inv[rb, cb]: the tile at (128 rb, 128 cb)

The columnwise copy q_t [C, R] is the transpose, block-scaled on its own rows (with 1x128
blocks: 128x1 blocks of x), with scale_inv_t of block_scale_shape(C, R, block).

The C++ ops and cuBLASLt read another layout (include/qmesh/block_quantized_tensor.h: 1x128
scales [ceil(C/128), round_up(R, 4)], tile scales [ceil(R/128), round_up(ceil(C/128), 4)],
padding zero). Each device converts its own shard's scales between the two around the
handlers (`to_layout`, `from_layout`: a transpose and a pad of R/128 or less of the data's
bytes): a shard of the data then holds exactly the block of the scale array of its blocks, so
every sharding that keeps whole blocks shards the scales with their data, as a plain slice.

Sharding: codes keep x's sharding (q_t the transposed one) and each scale tensor follows its
data: the scales' first dimension follows the data's rows, the second its columns (the
Shardy rules say so with compound factors: a dimension of whole 128-blocks is the factors
(blocks, 128)). A shard boundary must not cut a block: a dimension cut into 128-blocks (the
columns; the rows too with 128x128 tiles or with the 1x128 columnwise copy) must give shards
that are multiples of 128, else ValueError naming the tensor, the dimension, the mesh axes
and what to do. No amax is shared between devices: block scaling issues no collective (the
bias gradient is summed over the axes of g's rows).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

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
from qmesh.jax.operand_checks import check_group_sizes, check_matrix, check_whole_blocks
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
    """The shape of the scale_inv of a [rows, cols] tensor with `block` blocks, in JAX: one
    float32 per block, [rows, ceil(cols/128)] or [ceil(rows/128), ceil(cols/128)] (the C++
    function of this name gives the C++ layout's: layout_shape here)."""
    edge = BLOCK if check_block(block) == 2 else 1
    return -(-rows // edge), -(-cols // BLOCK)


def layout_shape(rows: int, cols: int, block: int) -> tuple[int, int]:
    """The shape of the same scales in the C++ ops' (and cuBLASLt's) layout, rows padded."""
    blocks = block_scale_shape(rows, cols, block)
    padded = blocks[::-1] if block == 1 else blocks
    return padded[0], -(-padded[1] // ALIGN) * ALIGN


def to_layout(scale_inv, block):
    """Scales of block_scale_shape -> the C++ layout (padding zero)."""
    s = scale_inv.T if block == 1 else scale_inv
    return jnp.pad(s, ((0, 0), (0, -s.shape[1] % ALIGN)))


def from_layout(scale_inv, shape, block):
    """Scales of a [rows, cols] tensor in the C++ layout -> block_scale_shape."""
    rows, cols = block_scale_shape(*shape, block)
    return scale_inv[:, :rows].T if block == 1 else scale_inv[:, :cols]


def _whole_blocks(mesh, axes, size, what):
    """Raises ValueError unless the shards of `size` over `axes` are multiples of 128."""
    check_whole_blocks(mesh, axes, size, BLOCK, what, "a scaling block")


def block_scale_spec(mesh, shape, block, row_axes, col_axes, what):
    """The PartitionSpec entries of the scales of a [rows, cols] block-scaled tensor sharded
    as (row_axes, col_axes), after checking that the sharding cuts no block."""
    rows, cols = shape
    _whole_blocks(mesh, col_axes, cols, f"{what}: the columns")
    if block == 2:
        _whole_blocks(mesh, row_axes, rows, f"{what}: the rows (128x128 tiles)")
    return entry(row_axes), entry(col_axes)


class Dim(NamedTuple):
    """A dimension in a Shardy rule: `dim` (its factors), `blocks` (the factor of its
    128-blocks) and the factor sizes."""

    dim: str
    blocks: str
    sizes: dict


def rule_dim(name: str, size: int, mesh) -> Dim:
    """The Dim of a dimension of `size` on `mesh`, with factors named after `name`. When its
    block count is a multiple of the mesh's device count, the dimension is the compound
    (blocks, 128): any mesh axes that shard it shard its blocks, whole, and the scales with
    them. Otherwise its blocks are a factor of their own (Shardy would otherwise split a mesh
    axis between the two factors, which the partitioning callbacks cannot take): the
    callbacks still shard the scales with the data (or refuse a sharding that cuts a block),
    and the partitioner moves the scales where the rule left them elsewhere."""
    if size and size % (BLOCK * math.prod(mesh.shape.values())) == 0:
        return Dim(f"({name}b {name}e)", f"{name}b", {f"{name}b": size // BLOCK, f"{name}e": BLOCK})
    return Dim(name, f"{name}b", {})


def sized(rule: str, sizes: dict) -> tuple[str, dict]:
    """(rule, the factor sizes Shardy takes for it: those of the factors that appear only in
    compounds; the size of a factor that is a whole dimension somewhere comes from it)."""
    whole = set(re.sub(r"\([^)]*\)|->|,", " ", rule).split())
    return rule, {f: v for f, v in sizes.items() if f not in whole}


def scale_rule(rows: Dim, cols: Dim, block: int) -> str:
    """The Shardy dimensions of the scales of a [rows, cols] tensor."""
    return f"{rows.dim if block == 1 else rows.blocks} {cols.blocks}"


def expand_scales(scale_inv, rows: int, cols: int, block: int):
    """The scale_inv of every element of a [rows, cols] block-scaled tensor, [rows, cols]."""
    per_row = scale_inv if block == 1 else jnp.repeat(scale_inv, BLOCK, axis=0)[:rows]
    return jnp.repeat(per_row, BLOCK, axis=1)[:, :cols]


# ---- block quantize and block dbias + quantize ------------------------------------------------


def _check_x(x, what):
    check_wide(x.dtype, what)
    check_matrix(x.shape, what, "block quantize")


def _block_avals(x, *, out_dtype, block, columnwise, shape_of=block_scale_shape):
    """(q, scale_inv, q_t, scale_inv_t) of block-quantizing x (the last two empty without the
    columnwise copy), the scales of `shape_of` (block_scale_shape, or layout_shape for the
    handlers)."""
    _check_x(x, "x")
    out_dtype = check_fp8(out_dtype)
    rows, cols = x.shape
    outs = [
        jax.core.ShapedArray(x.shape, out_dtype),
        jax.core.ShapedArray(shape_of(rows, cols, block), F32),
    ]
    if columnwise:
        outs += [
            jax.core.ShapedArray((cols, rows), out_dtype),
            jax.core.ShapedArray(shape_of(cols, rows, block), F32),
        ]
    else:
        outs += [jax.core.ShapedArray((0,), out_dtype), jax.core.ShapedArray((0,), F32)]
    return outs


def _block_shardings(mesh, x_info, block, columnwise):
    """Shardings of (x, q, scale_inv, q_t, scale_inv_t) for x's sharding, and x's row axes."""
    spec = even_spec(mesh, x_info)
    rows, cols = axes_of(spec[0]), axes_of(spec[1])
    shape = tuple(x_info.shape)
    what = f"block quantize: x {list(shape)}"
    outs = [
        named(mesh, *spec),
        named(mesh, *block_scale_spec(mesh, shape, block, rows, cols, what)),
        named(mesh),
        named(mesh),
    ]
    if columnwise:
        outs[2] = named(mesh, spec[1], spec[0])
        what_t = f"{what}, its columnwise copy {list(shape[::-1])}"
        outs[3] = named(mesh, *block_scale_spec(mesh, shape[::-1], block, cols, rows, what_t))
    return named(mesh, *spec), outs, rows


def _block_rule(shape, block, columnwise, mesh):
    """x's dimensions, the results' (codes follow x, the scales their codes' blocks), the
    factor sizes of the Shardy rule, and x's columns."""
    rows, cols = rule_dim("r", shape[0], mesh), rule_dim("c", shape[1], mesh)
    x = f"{rows.dim} {cols.dim}"
    outs = [x, scale_rule(rows, cols, block)]
    outs += [f"{cols.dim} {rows.dim}", scale_rule(cols, rows, block)] if columnwise else ["z", "t"]
    return x, outs, {**rows.sizes, **cols.sizes}, cols.dim


class _BlockCast(Op):
    """What block quantize and block dbias + quantize share: x -> (q, scale_inv, q_t,
    scale_inv_t[, ...]); the inner primitive also takes two zero-filled scale buffers in the
    C++ layout, which its scale results alias (their padding stays 0)."""

    num_inputs = 1
    static_params = ("out_dtype", "block", "columnwise", "power_2_scale", "amax_epsilon")
    output_aliases = {1: 1, 2: 3}

    @classmethod
    def abstract(cls, x, *zeros, out_dtype, block, columnwise, **scaling):
        return tuple(
            _block_avals(x, out_dtype=out_dtype, block=check_block(block), columnwise=columnwise)
        )

    @classmethod
    def inner_abstract(cls, x, *zeros, out_dtype, block, columnwise, **scaling):
        params = dict(out_dtype=out_dtype, block=check_block(block), columnwise=columnwise)
        return tuple(_block_avals(x, shape_of=layout_shape, **params))

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
    def empty(cls, x, *zeros, **params):
        return tuple(jnp.zeros(a.shape, a.dtype) for a in cls.inner_abstract(x, **params))

    @classmethod
    def local(cls, plan, x, **params):
        block = params["block"]
        _, s, _, s_t = cls.inner_abstract(x, **params)[:4]
        zeros = jnp.zeros(s.shape, F32), jnp.zeros(s_t.shape, F32)
        q, s, q_t, s_t, *rest = cls.inner.bind(x, *zeros, **params)
        s = from_layout(s, x.shape, block)
        if params["columnwise"]:
            s_t = from_layout(s_t, x.shape[::-1], block)
        return (q, s, q_t, s_t, *rest)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, block, columnwise, **_):
        x, outs, _ = _block_shardings(mesh, arg_infos[0], block, columnwise)
        return (x,), outs, None

    @classmethod
    def mesh_sharding_rule(cls, mesh, value_types, result_types, *, block, columnwise, **_):
        x, outs, sizes, _ = _block_rule(value_types[0].shape, block, columnwise, mesh)
        return sized(f"{x} -> {', '.join(outs)}", sizes)


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
        return (*super().abstract(g, *zeros, **params), jax.core.ShapedArray((g.shape[1],), F32))

    @classmethod
    def inner_abstract(cls, g, *zeros, **params):
        outs = super().inner_abstract(g, *zeros, **params)
        return (*outs, jax.core.ShapedArray((g.shape[1],), F32))

    @classmethod
    def local(cls, plan, g, **params):
        """plan: the mesh axes of g's rows (the bias gradient's sum), or None."""
        *outs, dbias = super().local(None, g, **params)
        return (*outs, lax.psum(dbias, plan) if plan else dbias)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, block, columnwise, **_):
        g, outs, rows = _block_shardings(mesh, arg_infos[0], block, columnwise)
        dbias = named(mesh, g.spec[1] if len(g.spec) > 1 else None)
        return (g,), (*outs, dbias), rows

    @classmethod
    def mesh_sharding_rule(cls, mesh, value_types, result_types, *, block, columnwise, **_):
        x, outs, sizes, cols = _block_rule(value_types[0].shape, block, columnwise, mesh)
        return sized(f"{x} -> {', '.join(outs)}, {cols}", sizes)


# ---- grouped block quantize -------------------------------------------------------------------


def grouped_scale_size(rows: int, cols: int, groups: int, block: int, columnwise=False) -> int:
    """The length of the flat scales of grouped_block_quantize of [rows, cols] in `groups`
    groups (of the columnwise copy with `columnwise`): room for any split of the rows."""
    # Over the groups, sum ceil(rows_g / 128) <= ceil(rows / 128) + groups - 1 and
    # round_up(n, 4) <= n + 3.
    blocks = -(-cols // BLOCK)
    row_blocks = max(0, -(-rows // BLOCK) + groups - 1)
    pad = (ALIGN - 1) * groups
    if check_block(block) == 1:
        return row_blocks * (-(-cols // ALIGN) * ALIGN) if columnwise else blocks * (rows + pad)
    return blocks * (row_blocks + pad) if columnwise else row_blocks * (-(-blocks // ALIGN) * ALIGN)


@register
class GroupedBlockQuantize(Op):
    """(x [rows, cols], group_sizes int32 [G]) -> (q, scale_inv, q_t, scale_inv_t): groups of
    rows back to back, each block-quantized as block_quantize of its rows (see
    grouped_block_quantize for the layouts). The inner primitive also takes two zero-filled
    scale buffers, which its scale results alias. The operands are replicated (group
    boundaries are runtime values)."""

    name, target = "qmesh_grouped_block_quantize", "qmesh_grouped_block_quantize"
    num_inputs = 2
    static_params = _BlockCast.static_params
    output_aliases = {2: 1, 3: 3}

    @classmethod
    def abstract(cls, x, group_sizes, *zeros, out_dtype, block, columnwise, **scaling):
        _check_x(x, "x")
        rows, cols = x.shape
        groups = check_group_sizes(group_sizes, rows, "grouped block quantize")
        out_dtype = check_fp8(out_dtype)
        size = grouped_scale_size(rows, cols, groups, block)
        outs = [jax.core.ShapedArray(x.shape, out_dtype), jax.core.ShapedArray((size,), F32)]
        if columnwise:
            size_t = grouped_scale_size(rows, cols, groups, block, columnwise=True)
            outs += [
                jax.core.ShapedArray((x.size,), out_dtype),
                jax.core.ShapedArray((size_t,), F32),
            ]
        else:
            outs += [jax.core.ShapedArray((0,), out_dtype), jax.core.ShapedArray((0,), F32)]
        return tuple(outs)

    attributes = _BlockCast.attributes

    @classmethod
    def is_empty(cls, x, group_sizes, *zeros, **params):
        return x.size == 0 or group_sizes.size == 0

    @classmethod
    def empty(cls, x, group_sizes, *zeros, **params):
        return tuple(jnp.zeros(a.shape, a.dtype) for a in cls.abstract(x, group_sizes, **params))

    @classmethod
    def local(cls, plan, x, group_sizes, **params):
        _, s, _, s_t = cls.abstract(x, group_sizes, **params)
        zeros = jnp.zeros(s.shape, F32), jnp.zeros(s_t.shape, F32)
        return cls.inner.bind(x, group_sizes, *zeros, **params)

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return "i j, g -> i j, s, k, t"


# ---- block dequantize -------------------------------------------------------------------------


@register
class BlockDequantize(Op):
    """(q, scale_inv) -> code * scale_inv of its block, in `out_dtype`; the inner primitive
    takes the scales in the C++ layout."""

    name, target, num_inputs = "qmesh_block_dequantize", "qmesh_block_dequantize", 2
    static_params = ("block", "out_dtype")

    @classmethod
    def abstract(cls, q, scale_inv, *, block, out_dtype, shape_of=block_scale_shape):
        check_fp8(q.dtype)
        if q.ndim != 2:
            raise ValueError(f"block dequantize takes q as [rows, cols], not shape {q.shape}")
        check_scale_inv(scale_inv, q.shape, check_block(block), "scale_inv", shape_of)
        return (jax.core.ShapedArray(q.shape, check_wide(out_dtype, "out_dtype")),)

    @classmethod
    def inner_abstract(cls, q, scale_inv, **params):
        return cls.abstract(q, scale_inv, shape_of=layout_shape, **params)

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
        return cls.inner.bind(q, to_layout(scale_inv, params["block"]), **params)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, block, **_):
        spec = even_spec(mesh, arg_infos[0])
        rows, cols = axes_of(spec[0]), axes_of(spec[1])
        shape = tuple(arg_infos[0].shape)
        scale = block_scale_spec(
            mesh, shape, block, rows, cols, f"block dequantize: q {list(shape)}"
        )
        q = named(mesh, *spec)
        return (q, named(mesh, *scale)), (q,), None

    @classmethod
    def mesh_sharding_rule(cls, mesh, value_types, result_types, *, block, **_):
        shape = value_types[0].shape
        rows, cols = rule_dim("r", shape[0], mesh), rule_dim("c", shape[1], mesh)
        x = f"{rows.dim} {cols.dim}"
        return sized(f"{x}, {scale_rule(rows, cols, block)} -> {x}", {**rows.sizes, **cols.sizes})


def check_scale_inv(scale_inv, shape, block, what, shape_of=block_scale_shape):
    """Raises ValueError unless scale_inv is float32 of shape_of(*shape, block)."""
    want = shape_of(*shape, block)
    if scale_inv.dtype != F32 or tuple(scale_inv.shape) != want:
        raise ValueError(
            f"{what} of a {list(shape)} tensor in {BLOCK_SHAPES[block]} blocks must be "
            f"float32{list(want)} ({shape_of.__name__}), not {scale_inv.dtype}"
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


def grouped_block_quantize(
    x,
    group_sizes,
    out_dtype=jnp.float8_e4m3fn,
    *,
    block: int = 1,
    columnwise: bool = False,
    power_2_scale: bool = True,
    amax_epsilon: float = 0.0,
):
    """Block-quantizes the row groups of x [R, C] (group g: the next group_sizes[g] rows, int32
    [G], adding up to R; a group may be empty), each exactly as block_quantize of its rows
    (its own blocks, from its first row): (q, scale_inv, q_t, scale_inv_t).

    q [R, C] holds each group's codes in its rows; with `columnwise`, q_t [R * C] each group's
    [C, R_g] transpose back to back (else q_t and scale_inv_t are empty). The scales are flat
    float32, grouped_scale_size(R, C, G, block[, columnwise]) long: group g's scales in the
    C++ layout of its shape (layout_shape(R_g, C, block); for q_t layout_shape(C, R_g,
    block)), flattened, back to back from group 0 on, then zeros. (Not one float per block as
    block_quantize gives them: the groups' boundaries are runtime values, and this is the
    layout the C++ ops and cuBLASLt read, group by group.) With 1x128 blocks q and the
    per-group scales equal block_quantize(x)'s, as no 1x128 block crosses a row."""
    return GroupedBlockQuantize.bind(
        jnp.asarray(x),
        jnp.asarray(group_sizes),
        **_cast_params(out_dtype, block, columnwise, power_2_scale, amax_epsilon),
    )


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
