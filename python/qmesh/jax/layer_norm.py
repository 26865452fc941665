"""LayerNorm over the last dimension on qmesh's op (float32 only), forward, backward, and the
forward fused with the FP8 cast of its output (what a LayerNorm -> FP8 Dense feeds the GEMM):

    y = (x - mean) / sqrt(var + eps) * gamma + beta,   var the biased variance of the row,

with mean and rstd = 1 / sqrt(var + eps) float32 of shape x.shape[:-1] (kept for backward).

Sharding: the rows (every dimension but the last) keep their sharding; the normalised (last)
dimension is never sharded: the Shardy rule marks it need-replication and the partitioner
all-gathers it. gamma and beta are replicated. Backward sums dgamma and dbeta over the mesh
axes that shard the rows (psum); the fused quantize reduces its amax with one pmax over every
mesh axis but the pipeline axis, as quantize does. A row dimension whose size its mesh axes do
not divide is replicated (padding rows would enter the sums and the amax).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import mlir

from qmesh.jax import sharding
from qmesh.jax.common import F32, axes_of, check_fp8, check_scalar, divides, entry, named, spec_of
from qmesh.jax.primitive import Op, register
from qmesh.jax.quantize import Quantized


def _f32(aval, what: str):
    if aval.dtype != F32:
        raise TypeError(
            f"layer_norm: {what} must be float32 (qmesh's LayerNorm is float32-only), "
            f"not {aval.dtype}"
        )


def _check_x(x, what: str = "x"):
    _f32(x, what)
    if x.ndim < 1:
        raise ValueError(
            f"layer_norm: {what} must have at least one dimension (the normalised "
            f"one), not shape {tuple(x.shape)}"
        )


def _check_vector(v, x, what: str):
    _f32(v, what)
    if v.shape != (x.shape[-1],):
        raise ValueError(
            f"layer_norm: {what} must be [{x.shape[-1]}] (the last dimension of x "
            f"{tuple(x.shape)}), not {list(v.shape)}"
        )


def _check_rows(v, x, what: str):
    _f32(v, what)
    if v.shape != tuple(x.shape[:-1]):
        raise ValueError(
            f"layer_norm: {what} must have shape {tuple(x.shape[:-1])} (x's rows), "
            f"not {tuple(v.shape)}"
        )


def _check_eps(eps):
    if not eps > 0:
        raise ValueError(f"layer_norm: eps must be > 0, not {eps}")


def _stats_avals(x):
    return jax.core.ShapedArray(x.shape[:-1], F32), jax.core.ShapedArray(x.shape[:-1], F32)


def _reference_forward(x, gamma, beta, eps):
    """LayerNorm in plain JAX (for inputs with no elements)."""
    mean = jnp.mean(x, axis=-1)
    var = jnp.mean(jnp.square(x - mean[..., None]), axis=-1)
    rstd = lax.rsqrt(var + eps)
    return (x - mean[..., None]) * rstd[..., None] * gamma + beta, mean, rstd


def _row_axes(mesh, info, ndim):
    """The mesh axes of each row dimension of an argument, replicated where the axes' device
    count does not divide the dimension."""
    spec = spec_of(info, ndim)
    rows = []
    for d in range(ndim - 1):
        axes = axes_of(spec[d])
        rows.append(axes if axes and divides(mesh, axes, info.shape[d]) else ())
    return rows


def _factors(value_types, index=0):
    """Rule factors of x's dimensions: r0 r1 ... for the rows, c for the normalised one."""
    rank = mlir.ir.ShapedType(value_types[index]).rank
    return [f"r{i}" for i in range(rank - 1)]


@register
class LayerNormForward(Op):
    """(x, gamma, beta) -> (y, mean, rstd)."""

    name, target, num_inputs = "qmesh_layer_norm_fwd", "qmesh_layer_norm_forward", 3
    static_params = ("eps",)

    @classmethod
    def abstract(cls, x, gamma, beta, *, eps):
        _check_x(x)
        _check_vector(gamma, x, "gamma")
        _check_vector(beta, x, "beta")
        _check_eps(eps)
        return (jax.core.ShapedArray(x.shape, F32), *_stats_avals(x))

    @classmethod
    def attributes(cls, *, eps):
        return dict(eps=np.float32(eps))

    @classmethod
    def empty(cls, x, gamma, beta, *, eps):
        return _reference_forward(x, gamma, beta, eps)

    @classmethod
    def shardings(cls, mesh, arg_infos, *, eps):
        x = arg_infos[0]
        rows = [entry(a) for a in _row_axes(mesh, x, x.ndim)]
        return (
            (named(mesh, *rows, None), named(mesh), named(mesh)),
            (named(mesh, *rows, None), named(mesh, *rows), named(mesh, *rows)),
            None,
        )

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, eps):
        r = " ".join(_factors(value_types))
        return (f"{r} c, c, c -> {r} c, {r}, {r}", {"need_replication_factors": ("c",)})


@register
class LayerNormBackward(Op):
    """(dy, x, gamma, mean, rstd) -> (dx, dgamma, dbeta)."""

    name, target, num_inputs = "qmesh_layer_norm_bwd", "qmesh_layer_norm_backward", 5

    @classmethod
    def abstract(cls, dy, x, gamma, mean, rstd):
        _check_x(x)
        _f32(dy, "dy")
        if dy.shape != x.shape:
            raise ValueError(
                f"layer_norm: dy must have x's shape {tuple(x.shape)}, not {tuple(dy.shape)}"
            )
        _check_vector(gamma, x, "gamma")
        _check_rows(mean, x, "mean")
        _check_rows(rstd, x, "rstd")
        vec = jax.core.ShapedArray((x.shape[-1],), F32)
        return jax.core.ShapedArray(x.shape, F32), vec, vec

    @classmethod
    def empty(cls, dy, x, gamma, mean, rstd):
        rows = tuple(range(x.ndim - 1))
        n = max(x.shape[-1], 1)
        xhat = (x - mean[..., None]) * rstd[..., None]
        g = dy * gamma
        dx = rstd[..., None] * (
            g - jnp.sum(g, -1, keepdims=True) / n - xhat * jnp.sum(g * xhat, -1, keepdims=True) / n
        )
        return dx, jnp.sum(dy * xhat, axis=rows), jnp.sum(dy, axis=rows)

    @classmethod
    def local(cls, plan, dy, x, gamma, mean, rstd):
        dx, dgamma, dbeta = cls.inner.bind(dy, x, gamma, mean, rstd)
        if plan:
            dgamma, dbeta = lax.psum((dgamma, dbeta), plan)
        return dx, dgamma, dbeta

    @classmethod
    def shardings(cls, mesh, arg_infos):
        x = arg_infos[1]
        axes = _row_axes(mesh, x, x.ndim)
        rows = [entry(a) for a in axes]
        args = (
            named(mesh, *rows, None),
            named(mesh, *rows, None),
            named(mesh),
            named(mesh, *rows),
            named(mesh, *rows),
        )
        outs = (named(mesh, *rows, None), named(mesh), named(mesh))
        return args, outs, tuple(a for row in axes for a in row)

    @classmethod
    def sharding_rule(cls, value_types, result_types):
        r = " ".join(_factors(value_types, 1))
        return (f"{r} c, {r} c, c, {r}, {r} -> {r} c, c, c", {"need_replication_factors": ("c",)})


@register
class LayerNormForwardQuantize(Op):
    """(x, gamma, beta, scale) -> (y, q, q_t, amax, scale_inv, mean, rstd): LayerNorm, then
    the FP8 cast of y with the given scale (q shaped like x; q_t its [cols, rows] transpose
    when `columnwise`, for a 2-D x, else an empty array)."""

    name, target = "qmesh_layer_norm_fwd_quantize", "qmesh_layer_norm_forward_quantize"
    num_inputs = 4
    static_params = ("eps", "out_dtype", "columnwise")

    @classmethod
    def abstract(cls, x, gamma, beta, scale, *, eps, out_dtype, columnwise):
        y, mean, rstd = LayerNormForward.abstract(x, gamma, beta, eps=eps)
        check_scalar(scale, "layer_norm: scale")
        out_dtype = check_fp8(out_dtype)
        if columnwise and x.ndim != 2:
            raise ValueError(
                f"layer_norm: the columnwise copy needs a 2-D x, not shape "
                f"{tuple(x.shape)}: reshape to [rows, cols] first"
            )
        q_t = (x.shape[1], x.shape[0]) if columnwise else (0,)
        scalar = jax.core.ShapedArray((), F32)
        return (
            y,
            jax.core.ShapedArray(x.shape, out_dtype),
            jax.core.ShapedArray(q_t, out_dtype),
            scalar,
            scalar,
            mean,
            rstd,
        )

    @classmethod
    def attributes(cls, *, eps, **_):
        return dict(eps=np.float32(eps))

    @classmethod
    def empty(cls, x, gamma, beta, scale, *, eps, out_dtype, columnwise):
        y, mean, rstd = _reference_forward(x, gamma, beta, eps)
        q_t = (x.shape[1], x.shape[0]) if columnwise else (0,)
        return (
            y,
            jnp.zeros(x.shape, out_dtype),
            jnp.zeros(q_t, out_dtype),
            jnp.zeros((), F32),
            1.0 / scale,
            mean,
            rstd,
        )

    @classmethod
    def local(cls, plan, *args, **params):
        y, q, q_t, amax, scale_inv, mean, rstd = cls.inner.bind(*args, **params)
        if plan:
            amax = lax.pmax(amax, plan)
        return y, q, q_t, amax, scale_inv, mean, rstd

    @classmethod
    def shardings(cls, mesh, arg_infos, *, columnwise, **_):
        x = arg_infos[0]
        rows = [entry(a) for a in _row_axes(mesh, x, x.ndim)]
        q_t = named(mesh, None, rows[0]) if columnwise else named(mesh)
        args = (named(mesh, *rows, None), named(mesh), named(mesh), named(mesh))
        outs = (
            named(mesh, *rows, None),
            named(mesh, *rows, None),
            q_t,
            named(mesh),
            named(mesh),
            named(mesh, *rows),
            named(mesh, *rows),
        )
        return args, outs, sharding.amax_axes(mesh)

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, columnwise, **_):
        r = " ".join(_factors(value_types))
        q_t = f"c {r}" if columnwise else "z"
        return (
            f"{r} c, c, c, -> {r} c, {r} c, {q_t}, , , {r}, {r}",
            {"need_replication_factors": ("c",)},
        )


def layer_norm_fwd(x, gamma, beta, eps: float = 1e-5):
    """(y, mean, rstd): LayerNorm of float32 x over its last dimension; mean and rstd have
    shape x.shape[:-1]."""
    return tuple(LayerNormForward.bind(x, gamma, beta, eps=float(eps)))


def layer_norm_bwd(dy, x, gamma, mean, rstd):
    """(dx, dgamma, dbeta) from the output gradient dy and forward's x, gamma, mean, rstd."""
    return tuple(LayerNormBackward.bind(dy, x, gamma, mean, rstd))


def layer_norm_fwd_quantize(
    x, gamma, beta, scale, dtype=jnp.float8_e4m3fn, *, eps: float = 1e-5, columnwise: bool = False
):
    """(y, Quantized, mean, rstd): LayerNorm of x and its FP8 cast with `scale` (delayed
    scaling): q = saturate(round(y * scale)); amax = max|y| over the whole (global) array; with
    columnwise=True (x 2-D) q_t holds the transpose's codes."""
    scale = jnp.asarray(scale)
    y, q, q_t, amax, scale_inv, mean, rstd = LayerNormForwardQuantize.bind(
        x,
        gamma,
        beta,
        scale,
        eps=float(eps),
        out_dtype=check_fp8(dtype),
        columnwise=bool(columnwise),
    )
    return y, Quantized(q, q_t, amax, scale, scale_inv), mean, rstd


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x, gamma, beta, eps: float = 1e-5):
    """LayerNorm of float32 x over its last dimension, differentiable (the backward is
    layer_norm_bwd)."""
    return layer_norm_fwd(x, gamma, beta, eps)[0]


def _layer_norm_fwd_rule(x, gamma, beta, eps):
    y, mean, rstd = layer_norm_fwd(x, gamma, beta, eps)
    return y, (x, gamma, mean, rstd)


def _layer_norm_bwd_rule(eps, residuals, dy):
    x, gamma, mean, rstd = residuals
    return layer_norm_bwd(dy, x, gamma, mean, rstd)


layer_norm.defvjp(_layer_norm_fwd_rule, _layer_norm_bwd_rule)
