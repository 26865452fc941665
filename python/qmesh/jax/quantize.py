"""FP8 quantization primitives: quantize (delayed or current scaling, optionally with the
columnwise copy), amax, the current-scaling scale, dequantize, dbias + quantize and grouped
quantize. Each runs qmesh's C++ op on every device's shard (CPU or CUDA).

Scaling conventions (docs/numerics.md): q = saturate(round(x * scale)) in the FP8 dtype,
x ~= q * scale_inv with scale_inv = 1 / scale; amax = max|x| (NaN propagates). Scalars (scale,
amax, scale_inv) are float32 arrays of shape ().

Sharding: codes keep the input's sharding (the columnwise copy the transposed one); amaxes are
reduced with one pmax over every mesh axis but the pipeline axis, so every device holds the
global amax (and, with current scaling, the same scale); a bias gradient is summed over the
axes that shard the rows.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qmesh.jax import sharding
from qmesh.jax.common import (
    F32,
    FP8_DTYPES,
    axes_of,
    check_fp8,
    check_scalar,
    check_wide,
    even_spec,
    named,
)
from qmesh.jax.operand_checks import check_group_sizes, check_matrix
from qmesh.jax.primitive import Op, register

_DTYPE_CODE = {FP8_DTYPES[0]: 3, FP8_DTYPES[1]: 4}  # qmesh's DType values


def _matrix(shape) -> tuple[int, int]:
    cols = shape[-1] if shape else 1
    return int(np.prod(shape[:-1], dtype=np.int64)) if shape else 1, cols


def _codes_avals(x, out_dtype, columnwise):
    """The FP8 outputs of quantizing x: codes shaped like x, and the columnwise copy."""
    check_wide(x.dtype, "x")
    out_dtype = check_fp8(out_dtype)
    if columnwise and x.ndim != 2:
        raise ValueError(
            f"the columnwise copy needs a 2-D input, not shape {x.shape}: "
            "reshape to [rows, cols] first"
        )
    q_t = (x.shape[1], x.shape[0]) if columnwise else (0,)
    return jax.core.ShapedArray(x.shape, out_dtype), jax.core.ShapedArray(q_t, out_dtype)


def _scalar():
    return jax.core.ShapedArray((), F32)


def _codes_shardings(mesh, x_info, columnwise):
    """Shardings of (x, codes, columnwise copy) for x's sharding (dimensions the mesh does not
    divide evenly replicated)."""
    spec = even_spec(mesh, x_info)
    q = named(mesh, *spec)
    q_t = named(mesh, spec[1], spec[0]) if columnwise else named(mesh)
    return named(mesh, *spec), q, q_t


def _codes_rule(columnwise):
    return ("i j", "i j, j i") if columnwise else ("... j", "... j, z")


@register
class Quantize(Op):
    """(x, scale) -> (q, q_t, amax, scale_inv): delayed scaling, the scale given."""

    name, target, num_inputs = "qmesh_quantize", "qmesh_quantize", 2
    unbatched_outputs = {3: (1,)}  # scale_inv = 1 / scale
    static_params = ("out_dtype", "columnwise")

    @classmethod
    def abstract(cls, x, scale, *, out_dtype, columnwise):
        check_scalar(scale, "scale")
        return (*_codes_avals(x, out_dtype, columnwise), _scalar(), _scalar())

    @classmethod
    def empty(cls, x, scale, *, out_dtype, columnwise):
        q, q_t = _codes_avals(x, out_dtype, columnwise)
        return (
            jnp.zeros(q.shape, q.dtype),
            jnp.zeros(q_t.shape, q_t.dtype),
            jnp.zeros((), F32),
            1.0 / scale,
        )

    @classmethod
    def local(cls, plan, x, scale, **params):
        q, q_t, amax, scale_inv = cls.inner.bind(x, scale, **params)
        return q, q_t, lax.pmax(amax, plan) if plan else amax, scale_inv

    @classmethod
    def shardings(cls, mesh, arg_infos, *, out_dtype, columnwise):
        x, q, q_t = _codes_shardings(mesh, arg_infos[0], columnwise)
        rep = named(mesh)
        return (x, rep), (q, q_t, rep, rep), sharding.amax_axes(mesh)

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, out_dtype, columnwise):
        x, codes = _codes_rule(columnwise)
        return f"{x}, -> {codes}, , "


@register
class Amax(Op):
    """x -> max|x| (float32 scalar), reduced over the mesh."""

    name, target, num_inputs = "qmesh_amax", "qmesh_amax", 1

    @classmethod
    def abstract(cls, x):
        check_wide(x.dtype, "x")
        return (_scalar(),)

    @classmethod
    def empty(cls, x):
        return (jnp.zeros((), F32),)

    @classmethod
    def local(cls, plan, x):
        (amax,) = cls.inner.bind(x)
        return (lax.pmax(amax, plan) if plan else amax,)

    @classmethod
    def shardings(cls, mesh, arg_infos):
        x = named(mesh, *even_spec(mesh, arg_infos[0]))
        return (x,), (named(mesh),), sharding.amax_axes(mesh)

    @classmethod
    def sharding_rule(cls, value_types, result_types):
        return "... -> "


@register
class CurrentScale(Op):
    """amax -> the current-scaling scale for FP8 dtype `fp8_dtype` (elementwise)."""

    name, target, num_inputs = "qmesh_current_scale", "qmesh_current_scale", 1
    static_params = ("fp8_dtype", "power_of_two_scales", "amax_epsilon")

    @classmethod
    def abstract(cls, amax, *, fp8_dtype, power_of_two_scales, amax_epsilon):
        if amax.dtype != F32:
            raise TypeError(f"amax must be float32, not {amax.dtype}")
        check_fp8(fp8_dtype)
        return (jax.core.ShapedArray(amax.shape, F32),)

    @classmethod
    def attributes(cls, *, fp8_dtype, power_of_two_scales, amax_epsilon):
        return dict(
            fp8_dtype=np.int32(_DTYPE_CODE[check_fp8(fp8_dtype)]),
            power_of_two_scales=bool(power_of_two_scales),
            amax_epsilon=np.float32(amax_epsilon),
        )

    @classmethod
    def empty(cls, amax, **params):
        return (jnp.zeros(amax.shape, F32),)

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return "... -> ..."


@register
class CurrentQuantize(Op):
    """x -> (q, q_t, amax, scale, scale_inv): current scaling. The amax is reduced over the
    mesh before the scale is taken from it, so every shard uses the same scale."""

    name, target, num_inputs = "qmesh_quantize_current", "qmesh_quantize", 1
    static_params = ("out_dtype", "columnwise", "power_of_two_scales", "amax_epsilon")
    # The ops it is composed of: the amax of what is cast, and the cast with a given scale.
    amax_op: type[Op] = Amax
    quantize_op: type[Op] = Quantize

    @classmethod
    def abstract(cls, x, *, out_dtype, columnwise, **scaling):
        return (*_codes_avals(x, out_dtype, columnwise), _scalar(), _scalar(), _scalar())

    @classmethod
    def is_empty(cls, *avals, **params):
        return False  # composed of other primitives, each of which handles empty inputs

    @classmethod
    def local(cls, plan, *xs, out_dtype, columnwise, power_of_two_scales, amax_epsilon):
        (amax,) = cls.amax_op.inner.bind(*xs)
        if plan:
            amax = lax.pmax(amax, plan)
        (scale,) = CurrentScale.inner.bind(
            amax,
            fp8_dtype=out_dtype,
            power_of_two_scales=power_of_two_scales,
            amax_epsilon=amax_epsilon,
        )
        q, q_t, _, scale_inv = cls.quantize_op.inner.bind(
            *xs, scale, out_dtype=out_dtype, columnwise=columnwise
        )
        return q, q_t, amax, scale, scale_inv

    @classmethod
    def shardings(cls, mesh, arg_infos, *, out_dtype, columnwise, **scaling):
        x, q, q_t = _codes_shardings(mesh, arg_infos[0], columnwise)
        rep = named(mesh)
        return (x,), (q, q_t, rep, rep, rep), sharding.amax_axes(mesh)

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, columnwise, **params):
        x, codes = _codes_rule(columnwise)
        return f"{x} -> {codes}, , , "


@register
class Dequantize(Op):
    """(q, scale_inv) -> q * scale_inv in `out_dtype`."""

    name, target, num_inputs = "qmesh_dequantize", "qmesh_dequantize", 2
    static_params = ("out_dtype",)

    @classmethod
    def abstract(cls, q, scale_inv, *, out_dtype):
        check_fp8(q.dtype)
        check_scalar(scale_inv, "scale_inv")
        out = jax.core.ShapedArray(q.shape, out_dtype)
        check_wide(out.dtype, "out_dtype")
        return (out,)

    @classmethod
    def empty(cls, q, scale_inv, *, out_dtype):
        return (jnp.zeros(q.shape, out_dtype),)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, out_dtype):
        q = named(mesh, *even_spec(mesh, arg_infos[0]))
        return (q, named(mesh)), (q,), None

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return "..., -> ..."


@register
class DbiasQuantize(Op):
    """(g, scale) -> (q, q_t, amax, scale_inv, dbias): quantize an output gradient and sum it
    over its rows (the bias gradient, float32 [cols]) in the same pass."""

    name, target, num_inputs = "qmesh_dbias_quantize", "qmesh_dbias_quantize", 2
    unbatched_outputs = {3: (1,)}  # scale_inv = 1 / scale
    static_params = ("out_dtype", "columnwise")

    @classmethod
    def abstract(cls, g, *rest, out_dtype, columnwise):
        check_scalar(rest[-1], "scale")
        if g.ndim < 1:
            raise ValueError("g must have at least one dimension (its last is the bias's)")
        return (
            *_codes_avals(g, out_dtype, columnwise),
            _scalar(),
            _scalar(),
            jax.core.ShapedArray((g.shape[-1],), F32),
        )

    @classmethod
    def empty(cls, g, *rest, **params):
        q, q_t, amax, scale_inv = Quantize.empty(g, rest[-1], **params)
        return q, q_t, amax, scale_inv, jnp.zeros((g.shape[-1],), F32)

    @classmethod
    def local(cls, plan, *args, **params):
        return reduce_dbias(plan, *cls.inner.bind(*args, **params))

    @classmethod
    def shardings(cls, mesh, arg_infos, *, out_dtype, columnwise):
        g, q, q_t = _codes_shardings(mesh, arg_infos[0], columnwise)
        rep = named(mesh)
        dbias, plan = dbias_sharding(mesh, arg_infos[0])
        tensors = (g,) * (cls.num_inputs - 1)  # g and the operands shaped like it
        return (*tensors, rep), (q, q_t, rep, rep, dbias), plan

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, columnwise, **params):
        x, codes = _codes_rule(columnwise)
        tensors = ", ".join([x] * (cls.num_inputs - 1))
        return f"{tensors}, -> {codes}, , , j"


def dbias_sharding(mesh, g_info):
    """(the bias gradient's sharding, the plan of reduce_dbias) for a gradient g sharded as
    g_info: dbias is sharded like g's last dimension and summed over the axes of its rows."""
    spec = even_spec(mesh, g_info)
    rows = tuple(a for entry in spec[:-1] for a in axes_of(entry))
    return named(mesh, spec[-1]), (sharding.amax_axes(mesh), rows)


def reduce_dbias(plan, q, q_t, amax, *scalars_and_dbias):
    """The outputs of a quantize with a bias gradient on one device's shard, with the amax
    reduced (pmax) and the bias gradient summed (psum) over the mesh axes of `plan`."""
    *scalars, dbias = scalars_and_dbias
    if plan:
        amax_axes, row_axes = plan
        amax = lax.pmax(amax, amax_axes)
        if row_axes:
            dbias = lax.psum(dbias, row_axes)
    return (q, q_t, amax, *scalars, dbias)


@register
class GroupedQuantize(Op):
    """(x [rows, cols], group_sizes int32 [G], scales float32 [G]) -> (q, q_t, amax [G],
    scale_inv [G]): groups of rows back to back, each quantized with its own scale. q_t holds
    each group's [cols, rows_g] transpose back to back (flat), or is empty. A group may be
    empty. The operands are replicated (group boundaries are runtime values)."""

    name, target, num_inputs = "qmesh_grouped_quantize", "qmesh_grouped_quantize", 3
    static_params = ("out_dtype", "columnwise")

    @classmethod
    def abstract(cls, x, group_sizes, scales, *, out_dtype, columnwise):
        check_wide(x.dtype, "x")
        check_matrix(x.shape, "x", "grouped quantize")
        check_group_sizes(group_sizes, x.shape[0], "grouped quantize")
        if scales.dtype != F32 or scales.shape != group_sizes.shape:
            raise TypeError(
                f"scales must be float32 {list(group_sizes.shape)} (one per group), "
                f"not {scales.dtype}{list(scales.shape)}"
            )
        out_dtype = check_fp8(out_dtype)
        g = group_sizes.shape
        q_t = (x.size,) if columnwise else (0,)
        return (
            jax.core.ShapedArray(x.shape, out_dtype),
            jax.core.ShapedArray(q_t, out_dtype),
            jax.core.ShapedArray(g, F32),
            jax.core.ShapedArray(g, F32),
        )

    @classmethod
    def is_empty(cls, x, group_sizes, scales, **params):
        return x.size == 0 or group_sizes.size == 0

    @classmethod
    def empty(cls, x, group_sizes, scales, *, out_dtype, columnwise):
        q_t = (x.size,) if columnwise else (0,)
        return (
            jnp.zeros(x.shape, out_dtype),
            jnp.zeros(q_t, out_dtype),
            jnp.zeros(scales.shape, F32),
            1.0 / scales,
        )

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return "i j, g, g -> i j, k, g, g"


def check_scale_values(scale, what: str = "scale"):
    """Raises ValueError for a concrete scale that is not a normal positive finite float32
    (0, a denormal, negative, NaN or inf would give all-zero or NaN codes); traced scales
    pass (the delayed-scaling state guards them inside a step, see delayed_state.py)."""
    if isinstance(scale, jax.core.Tracer):
        return scale
    values = np.asarray(scale, np.float32)
    tiny, big = np.finfo(np.float32).tiny, np.finfo(np.float32).max
    bad = values[~((values >= tiny) & (values <= big))]
    if bad.size:
        raise ValueError(
            f"{what} must be a normal positive finite float32 (at least {tiny}), "
            f"got {bad.reshape(-1)[0]!r}: compute it with current_scale(amax) or "
            "keep the previous scale"
        )
    return scale


def _f32_number(value, what: str):
    """A scalar argument as a JAX array: Python and numpy numbers become float32 (integers only
    when exact); arrays are left for the primitive's type check."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be a float32 scalar, not a boolean")
    if isinstance(value, (int, np.integer)) and int(np.float32(value)) != int(value):
        raise ValueError(f"{what} {value!r} is not exactly representable as float32")
    if isinstance(value, (int, float, np.integer, np.floating)):
        value = np.float32(value)
    return jnp.asarray(value)


def _as_f32_scale(scale, what: str = "scale"):
    """A scale argument (see _f32_number), checked by check_scale_values."""
    return check_scale_values(_f32_number(scale, what), what)


class Quantized(NamedTuple):
    """A quantized tensor: codes, the columnwise copy (empty when not asked for), and its
    float32 scalars."""

    q: jax.Array
    q_t: jax.Array
    amax: jax.Array
    scale: jax.Array
    scale_inv: jax.Array


def quantize(x, scale, dtype=jnp.float8_e4m3fn, *, columnwise: bool = False) -> Quantized:
    """Delayed scaling: quantizes x with the given scale (float32 scalar). amax is max|x| over
    the whole (global) array. With columnwise=True, x must be 2-D and q_t is its transpose's
    codes. The scale must be a normal positive finite float32 (checked when concrete)."""
    scale = _as_f32_scale(scale)
    q, q_t, amax, scale_inv = Quantize.bind(
        x, scale, out_dtype=check_fp8(dtype), columnwise=bool(columnwise)
    )
    return Quantized(q, q_t, amax, scale, scale_inv)


def quantize_current(
    x,
    dtype=jnp.float8_e4m3fn,
    *,
    columnwise: bool = False,
    power_of_two_scales: bool = False,
    amax_epsilon: float = 0.0,
) -> Quantized:
    """Current scaling: the scale comes from max|x| of the whole (global) array."""
    q, q_t, amax, scale, scale_inv = CurrentQuantize.bind(
        x,
        out_dtype=check_fp8(dtype),
        columnwise=bool(columnwise),
        power_of_two_scales=bool(power_of_two_scales),
        amax_epsilon=float(amax_epsilon),
    )
    return Quantized(q, q_t, amax, scale, scale_inv)


def amax(x) -> jax.Array:
    """max|x| as a float32 scalar (NaN if x holds a NaN; 0 for an empty x)."""
    return Amax.bind(x)[0]


def current_scale(
    amax, dtype=jnp.float8_e4m3fn, *, power_of_two_scales: bool = False, amax_epsilon: float = 0.0
) -> jax.Array:
    """The current-scaling scale of each float32 amax: fp8_max / max(amax, amax_epsilon); 1 for
    a zero, infinite or NaN amax; at most FLT_MAX; optionally rounded down to a power of 2."""
    return CurrentScale.bind(
        jnp.asarray(amax, jnp.float32),
        fp8_dtype=check_fp8(dtype),
        power_of_two_scales=bool(power_of_two_scales),
        amax_epsilon=float(amax_epsilon),
    )[0]


def dequantize(q, scale_inv, dtype=jnp.float32) -> jax.Array:
    """q * scale_inv, computed in float32 and rounded to `dtype`."""
    return Dequantize.bind(q, _f32_number(scale_inv, "scale_inv"), out_dtype=jnp.dtype(dtype))[0]


def dbias_quantize(g, scale, dtype=jnp.float8_e5m2, *, columnwise: bool = False):
    """(Quantized gradient, dbias): quantizes g with `scale` and returns the float32 sum of g
    over all but its last dimension (summed over the mesh axes that shard those rows)."""
    scale = _as_f32_scale(scale)
    q, q_t, amax_, scale_inv, dbias = DbiasQuantize.bind(
        g, scale, out_dtype=check_fp8(dtype), columnwise=bool(columnwise)
    )
    return Quantized(q, q_t, amax_, scale, scale_inv), dbias


def grouped_quantize(
    x, group_sizes, scales, dtype=jnp.float8_e4m3fn, *, columnwise: bool = False
) -> Quantized:
    """Quantizes the row groups of x [rows, cols] (group g: the next group_sizes[g] rows) each
    with scales[g]; amax and scale_inv have one entry per group."""
    scales = check_scale_values(jnp.asarray(scales), "scales")
    q, q_t, amax_, scale_inv = GroupedQuantize.bind(
        x, jnp.asarray(group_sizes), scales, out_dtype=check_fp8(dtype), columnwise=bool(columnwise)
    )
    return Quantized(q, q_t, amax_, scales, scale_inv)
