"""Grouped MXFP8 and NVFP4 quantize (docs/design/mxfp8.md, docs/design/nvfp4.md): the row
groups of x [R, C] (group g: the next group_sizes[g] rows, int32 [G], adding up to R; a group
may be empty), each quantized exactly as mxfp8_quantize / nvfp4_quantize of its own rows, by
the C++ ops grouped_mxfp8_quantize / grouped_nvfp4_quantize (include/qmesh/ops/
grouped_quantize.h), one non-grouped cast per non-empty group.

Every group's rows must be whole blocks (a multiple of 32 for MXFP8, 16 for NVFP4; the
columnwise copy's blocks start at each group's first row): the handler refuses other splits
(group sizes are runtime values), naming the group. The rowwise results are then the groups'
rows in order, in the non-grouped shapes; the columnwise copy and its scales are flat, group
g's transpose [C, R_g] (and its scales [C, R_g / block]) back to back from element R_0 + ... +
R_{g-1} times C (over the block for the scales) on. No part needs padding, whatever the split.

NVFP4 takes one per-tensor scale per group and copy (scale_inv, scale_inv_t: float32 [G], from
that group's amax; 0 for an empty group), as TransformerEngine's grouped NVFP4 quantize does:
each group is one GEMM operand. Stochastic rounding in group g uses the seed
seed + g * 0x9E3779B97F4A7C15 (mod 2^64; seed = key[0] << 32 | key[1]; C++
nvfp4_group_seed), so group 0 rounds as nvfp4_quantize with `key` and the groups draw distinct
bits. The RHT signs are the same for every group.

The operands are replicated (the group boundaries are runtime values).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from qmesh.jax import mxfp8, nvfp4
from qmesh.jax.common import F32, check_fp8, check_wide
from qmesh.jax.operand_checks import check_group_sizes, check_matrix
from qmesh.jax.primitive import Op, register

GROUP_SEED_STEP = 0x9E3779B97F4A7C15  # group g's seed: seed + g * GROUP_SEED_STEP (mod 2^64)


def _grouped_x(x, group_sizes, op, block):
    """(rows, cols, groups) of a grouped quantize of x, after the checks."""
    check_wide(x.dtype, f"{op}: x")
    rows, cols = check_matrix(x.shape, "x", op, multiple=block)
    return rows, cols, check_group_sizes(group_sizes, rows, op)


@register
class GroupedMxfp8Quantize(Op):
    """(x [R, C], group_sizes int32 [G]) -> (q [R, C], scale [R, C/32], q_t [R*C], scale_t
    [R*C/32]) (the last two empty without `columnwise`)."""

    name, target = "qmesh_grouped_mxfp8_quantize", "qmesh_grouped_mxfp8_quantize"
    num_inputs = 2
    static_params = ("out_dtype", "columnwise", "margin")

    @classmethod
    def abstract(cls, x, group_sizes, *, out_dtype, columnwise, margin):
        rows, cols, _ = _grouped_x(x, group_sizes, "grouped MXFP8 quantize", mxfp8.MX_BLOCK)
        out_dtype = check_fp8(out_dtype)
        scales = rows * cols // mxfp8.MX_BLOCK
        flat = (x.size,) if columnwise else (0,)
        return (
            jax.core.ShapedArray((rows, cols), out_dtype),
            jax.core.ShapedArray((rows, cols // mxfp8.MX_BLOCK), mxfp8.E8M0),
            jax.core.ShapedArray(flat, out_dtype),
            jax.core.ShapedArray((scales if columnwise else 0,), mxfp8.E8M0),
        )

    attributes = mxfp8.Mxfp8Quantize.attributes

    @classmethod
    def empty(cls, x, group_sizes, **params):
        return tuple(jnp.zeros(a.shape, a.dtype) for a in cls.abstract(x, group_sizes, **params))

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return "i j, g -> i j, i k, m, n"


@register
class GroupedNvfp4Quantize(Op):
    """(x [R, C], group_sizes int32 [G], key words int32 [2]) -> (data uint8 [R, C/2], scale
    [R, C/16], scale_inv [G], data_t [R*C/2], scale_t [R*C/16], scale_inv_t [G]) (the last three
    empty without `columnwise`). The inner primitive also takes two zero-filled [G] buffers,
    which scale_inv and scale_inv_t alias (an empty group's entries stay 0)."""

    name, target = "qmesh_grouped_nvfp4_quantize", "qmesh_grouped_nvfp4_quantize"
    num_inputs = 3
    static_params = nvfp4.Nvfp4Quantize.static_params
    output_aliases = {3: 2, 4: 5}

    @classmethod
    def abstract(cls, x, group_sizes, key, *zeros, columnwise, **_):
        rows, cols, groups = _grouped_x(x, group_sizes, "grouped NVFP4 quantize", nvfp4.BLOCK)
        if key.dtype != nvfp4.I32 or key.shape != (2,):
            raise TypeError(f"grouped_nvfp4_quantize: the key words must be int32[2], not {key}")
        copy = [
            jax.core.ShapedArray((rows * cols // 2,), nvfp4.U8),
            jax.core.ShapedArray((rows * cols // nvfp4.BLOCK,), nvfp4.E4M3),
            jax.core.ShapedArray((groups,), F32),
        ]
        rowwise = [
            jax.core.ShapedArray((rows, cols // 2), nvfp4.U8),
            jax.core.ShapedArray((rows, cols // nvfp4.BLOCK), nvfp4.E4M3),
            copy[2],
        ]
        if not columnwise:
            copy = [jax.core.ShapedArray((0,), a.dtype) for a in copy]
        return tuple(rowwise + copy)

    attributes = staticmethod(nvfp4.cast_attributes)

    @classmethod
    def is_empty(cls, x, group_sizes, *rest, **params):
        return x.size == 0 or group_sizes.size == 0

    @classmethod
    def empty(cls, x, group_sizes, key, *zeros, **params):
        return tuple(
            jnp.zeros(a.shape, a.dtype) for a in cls.abstract(x, group_sizes, key, **params)
        )

    @classmethod
    def local(cls, plan, x, group_sizes, key, **params):
        outs = cls.abstract(x, group_sizes, key, **params)
        zeros = jnp.zeros(outs[2].shape, F32), jnp.zeros(outs[5].shape, F32)
        return cls.inner.bind(x, group_sizes, key, *zeros, **params)

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return "i j, g, k -> i a, i b, g, m, n, t"


def group_key(key, group: int):
    """The uint32 [2] key data that nvfp4_quantize takes to round as group `group` of a
    grouped_nvfp4_quantize with `key` does (seed + group * GROUP_SEED_STEP, mod 2^64)."""
    words = np.asarray(jax.device_get(nvfp4.key_words(key))).view(np.uint32)
    seed = (int(words[0]) << 32 | int(words[1])) + group * GROUP_SEED_STEP
    seed %= 1 << 64
    return jnp.asarray([seed >> 32, seed & 0xFFFFFFFF], jnp.uint32)


# ---- the functions users call -----------------------------------------------------------------


def grouped_mxfp8_quantize(
    x, group_sizes, out_dtype=jnp.float8_e4m3fn, *, columnwise=False, margin=0.0
):
    """MXFP8-quantizes the row groups of x [R, C] (group_sizes int32 [G], each a multiple of
    32), each as mxfp8_quantize of its rows: (q [R, C], scale [R, C/32], q_t, scale_t), q_t
    [R*C] and scale_t [R*C/32] holding each group's columnwise copy and its scales back to back
    (empty without `columnwise`)."""
    return GroupedMxfp8Quantize.bind(
        jnp.asarray(x),
        jnp.asarray(group_sizes),
        **mxfp8.quantize_params(out_dtype, columnwise, margin),
    )


def grouped_nvfp4_quantize(
    x,
    group_sizes,
    key=None,
    *,
    columnwise: bool = False,
    stochastic_rounding: bool = False,
    tiles_2d: bool = False,
    rht: bool = False,
    rht_signs: int = 0,
):
    """NVFP4-quantizes the row groups of x [R, C] (group_sizes int32 [G], each a multiple of
    16), each as nvfp4_quantize of its rows with its own per-tensor scales and the seed of
    group_key(key, g): (data [R, C/2], scale [R, C/16], scale_inv [G], data_t [R*C/2], scale_t
    [R*C/16], scale_inv_t [G]), the columnwise copies back to back (empty without
    `columnwise`). The options are nvfp4_quantize's."""
    words, params = nvfp4.quantize_options(
        "grouped_nvfp4_quantize", key, columnwise, stochastic_rounding, tiles_2d, rht, rht_signs
    )
    return GroupedNvfp4Quantize.bind(jnp.asarray(x), jnp.asarray(group_sizes), words, **params)
