"""FP8 casts fused with GELU's forward and backward (qmesh's ops/activation_cast.h): a GELU
MLP never writes its hidden activation, or that activation's gradient, in a wide type.

    hq = gelu_quantize(pre, scale, dtype)                  # the codes of gelu(pre)
    gq, dbias = dgelu_dbias_quantize(dh, pre, scale, dtype)  # of dh * gelu'(pre), and its
                                                             # column sums (the bias gradient)

and their current-scaling forms (`*_current`: the scale from the amax of what is cast,
reduced over the mesh first). GELU is the tanh approximation of qmesh.jax.gemm.gelu, computed
bit for bit as qmesh's C++ op does; the codes, amax and sharding follow quantize.py's rules
(the amax of gelu(pre), or of dh * gelu'(pre)).
"""

from __future__ import annotations

import jax

from qmesh.jax import sharding
from qmesh.jax.common import check_fp8, check_wide, even_spec, named
from qmesh.jax.primitive import Op, register
from qmesh.jax.quantize import (
    Amax,
    CurrentQuantize,
    CurrentScale,
    DbiasQuantize,
    Quantize,
    Quantized,
    _as_f32_scale,
    _codes_rule,
    _codes_shardings,
    _scalar,
    dbias_sharding,
)


def _check_pre(dh, pre):
    """Raises unless the saved pre-activation matches the gradient dh (shape and dtype)."""
    check_wide(pre.dtype, "pre")
    if pre.shape != dh.shape or pre.dtype != dh.dtype:
        raise ValueError(
            f"pre (the saved pre-activation) must have dh's shape and dtype: dh is "
            f"{dh.dtype}{list(dh.shape)}, pre {pre.dtype}{list(pre.shape)}"
        )


@register
class GeluQuantize(Quantize):
    """(pre, scale) -> (q, q_t, amax, scale_inv) of gelu(pre), the scale given."""

    name, target = "qmesh_gelu_quantize", "qmesh_gelu_quantize"


@register
class GeluAmax(Amax):
    """pre -> max|gelu(pre)| (float32 scalar), reduced over the mesh."""

    name, target = "qmesh_gelu_amax", "qmesh_gelu_amax"


@register
class GeluCurrentQuantize(CurrentQuantize):
    """pre -> (q, q_t, amax, scale, scale_inv) of gelu(pre): current scaling."""

    name = "qmesh_gelu_quantize_current"
    amax_op, quantize_op = GeluAmax, GeluQuantize


@register
class DgeluDbiasQuantize(DbiasQuantize):
    """(dh, pre, scale) -> (q, q_t, amax, scale_inv, dbias) of g = dh * gelu'(pre): the
    gradient of a GELU's input cast, and summed over its rows, in one pass."""

    name, target, num_inputs = "qmesh_dgelu_dbias_quantize", "qmesh_dgelu_dbias_quantize", 3

    @classmethod
    def abstract(cls, dh, pre, scale, **params):
        _check_pre(dh, pre)
        return super().abstract(dh, scale, **params)


@register
class DgeluAmax(Op):
    """(dh, pre) -> max|dh * gelu'(pre)| (float32 scalar), reduced over the mesh."""

    name, target, num_inputs = "qmesh_dgelu_amax", "qmesh_dgelu_amax", 2

    @classmethod
    def abstract(cls, dh, pre):
        check_wide(dh.dtype, "dh")
        _check_pre(dh, pre)
        return (_scalar(),)

    @classmethod
    def empty(cls, dh, pre):
        return Amax.empty(dh)

    @classmethod
    def local(cls, plan, dh, pre):
        (amax,) = cls.inner.bind(dh, pre)
        return (jax.lax.pmax(amax, plan) if plan else amax,)

    @classmethod
    def shardings(cls, mesh, arg_infos):
        x = named(mesh, *even_spec(mesh, arg_infos[0]))
        return (x, x), (named(mesh),), sharding.amax_axes(mesh)

    @classmethod
    def sharding_rule(cls, value_types, result_types):
        return "..., ... -> "


@register
class DgeluDbiasCurrentQuantize(Op):
    """(dh, pre) -> (q, q_t, amax, scale, scale_inv, dbias) of g = dh * gelu'(pre): current
    scaling (the amax reduced over the mesh before the scale), with the bias gradient."""

    name, num_inputs = "qmesh_dgelu_dbias_quantize_current", 2
    static_params = ("out_dtype", "columnwise", "power_of_two_scales", "amax_epsilon")

    @classmethod
    def abstract(cls, dh, pre, *, out_dtype, columnwise, **scaling):
        q, q_t, amax, scale_inv, dbias = DgeluDbiasQuantize.abstract(
            dh, pre, _scalar(), out_dtype=out_dtype, columnwise=columnwise
        )
        return q, q_t, amax, _scalar(), scale_inv, dbias

    @classmethod
    def is_empty(cls, *avals, **params):
        return False  # composed of other primitives, each of which handles empty inputs

    @classmethod
    def local(cls, plan, dh, pre, *, out_dtype, columnwise, power_of_two_scales, amax_epsilon):
        amax_axes, row_axes = plan or (None, None)
        (amax,) = DgeluAmax.local(amax_axes, dh, pre)
        (scale,) = CurrentScale.inner.bind(
            amax,
            fp8_dtype=out_dtype,
            power_of_two_scales=power_of_two_scales,
            amax_epsilon=amax_epsilon,
        )
        q, q_t, _, scale_inv, dbias = DgeluDbiasQuantize.inner.bind(
            dh, pre, scale, out_dtype=out_dtype, columnwise=columnwise
        )
        if row_axes:
            dbias = jax.lax.psum(dbias, row_axes)
        return q, q_t, amax, scale, scale_inv, dbias

    @classmethod
    def shardings(cls, mesh, arg_infos, *, out_dtype, columnwise, **scaling):
        g, q, q_t = _codes_shardings(mesh, arg_infos[0], columnwise)
        rep = named(mesh)
        dbias, plan = dbias_sharding(mesh, arg_infos[0])
        return (g, g), (q, q_t, rep, rep, rep, dbias), plan

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, columnwise, **params):
        x, codes = _codes_rule(columnwise)
        return f"{x}, {x} -> {codes}, , , , j"


def gelu_quantize(pre, scale, dtype, *, columnwise: bool = False) -> Quantized:
    """Delayed scaling: the codes of gelu(pre) with the given scale (as quantize(gelu(pre),
    ...), without writing gelu(pre)); amax is max|gelu(pre)| over the whole array."""
    scale = _as_f32_scale(scale)
    q, q_t, amax, scale_inv = GeluQuantize.bind(
        pre, scale, out_dtype=check_fp8(dtype), columnwise=bool(columnwise)
    )
    return Quantized(q, q_t, amax, scale, scale_inv)


def gelu_quantize_current(
    pre, dtype, *, columnwise: bool = False, power_of_two_scales=False, amax_epsilon=0.0
) -> Quantized:
    """Current scaling: as gelu_quantize with the scale from max|gelu(pre)|."""
    q, q_t, amax, scale, scale_inv = GeluCurrentQuantize.bind(
        pre,
        out_dtype=check_fp8(dtype),
        columnwise=bool(columnwise),
        power_of_two_scales=bool(power_of_two_scales),
        amax_epsilon=float(amax_epsilon),
    )
    return Quantized(q, q_t, amax, scale, scale_inv)


def dgelu_dbias_quantize(dh, pre, scale, dtype, *, columnwise: bool = False):
    """(Quantized g, dbias) for g = dh * gelu'(pre) (pre: GELU's saved input, dh the gradient
    of its output; same shape and dtype), with the given scale: as dbias_quantize(g, ...),
    without writing g."""
    scale = _as_f32_scale(scale)
    q, q_t, amax, scale_inv, dbias = DgeluDbiasQuantize.bind(
        dh, pre, scale, out_dtype=check_fp8(dtype), columnwise=bool(columnwise)
    )
    return Quantized(q, q_t, amax, scale, scale_inv), dbias


def dgelu_dbias_quantize_current(
    dh, pre, dtype, *, columnwise: bool = False, power_of_two_scales=False, amax_epsilon=0.0
):
    """Current scaling: as dgelu_dbias_quantize with the scale from max|dh * gelu'(pre)|."""
    q, q_t, amax, scale, scale_inv, dbias = DgeluDbiasCurrentQuantize.bind(
        dh,
        pre,
        out_dtype=check_fp8(dtype),
        columnwise=bool(columnwise),
        power_of_two_scales=bool(power_of_two_scales),
        amax_epsilon=float(amax_epsilon),
    )
    return Quantized(q, q_t, amax, scale, scale_inv), dbias
