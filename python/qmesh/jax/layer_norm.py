"""LayerNorm over the last dimension on qmesh's op (float32), forward and backward; RMSNorm;
and either norm's forward fused with the FP8 cast of its output (float32 or bfloat16 x: what a
norm -> FP8 Dense feeds the GEMM; qmesh::norm_forward, docs/numerics.md "Norms"):

    LayerNorm: y = (x - mean) / sqrt(var + eps) * gamma + beta,  var the biased variance,
    RMSNorm:   y = x / sqrt(mean(x^2) + eps) * gamma,

with mean and rstd (1 / the square root) float32 of shape x.shape[:-1] (kept for backward).

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


_EMPTY = jax.core.ShapedArray((0,), F32)


@register
class NormForward(Op):
    """(x, gamma, beta, scale) -> (y, q, q_t, amax, scale_inv, mean, rstd): LayerNorm, or RMSNorm
    when `rms` (beta and mean are then empty arrays), of float32 or bfloat16 x, in one pass with
    the FP8 cast of its output y (y_dtype: float32 or bfloat16; the cast takes y rounded to
    it). With out_dtype: q shaped like x and, when `columnwise` (2-D x), q_t its [cols, rows]
    transpose, with the given scale; scale_inv = 1 / scale. Without (out_dtype None: q, q_t and
    scale_inv are empty arrays, scale is not read): no codes, for current scaling. amax is
    max|y| over the whole (global) array either way."""

    name, target, num_inputs = "qmesh_norm_fwd", "qmesh_norm_forward", 4
    static_params = ("eps", "rms", "y_dtype", "out_dtype", "columnwise")

    @classmethod
    def abstract(cls, x, gamma, beta, scale, *, eps, rms, y_dtype, out_dtype, columnwise):
        if x.dtype not in (F32, jnp.bfloat16):
            raise TypeError(f"norm: x must be float32 or bfloat16, not {x.dtype}")
        if x.ndim < 1:
            raise ValueError(
                f"norm: x must have at least one dimension (the normalised one), not shape "
                f"{tuple(x.shape)}"
            )
        _check_vector(gamma, x, "gamma")
        if rms:
            if beta.shape != (0,):
                raise ValueError("norm: RMSNorm takes no beta (pass an empty array)")
        else:
            _check_vector(beta, x, "beta")
        _check_eps(eps)
        if jnp.dtype(y_dtype) not in (F32, jnp.bfloat16):
            raise TypeError(f"norm: y_dtype must be float32 or bfloat16, not {y_dtype}")
        check_scalar(scale, "norm: scale")
        if columnwise and (x.ndim != 2 or out_dtype is None):
            raise ValueError(
                f"norm: the columnwise copy needs codes and a 2-D x, not shape "
                f"{tuple(x.shape)}: reshape to [rows, cols] first"
            )
        scalar = jax.core.ShapedArray((), F32)
        y = jax.core.ShapedArray(x.shape, jnp.dtype(y_dtype))
        mean, rstd = _stats_avals(x)
        if out_dtype is None:
            q = q_t = scale_inv = _EMPTY
        else:
            out_dtype = check_fp8(out_dtype)
            q = jax.core.ShapedArray(x.shape, out_dtype)
            q_t = jax.core.ShapedArray((x.shape[1], x.shape[0]) if columnwise else (0,), out_dtype)
            scale_inv = scalar
        return y, q, q_t, scalar, scale_inv, _EMPTY if rms else mean, rstd

    @classmethod
    def attributes(cls, *, eps, **_):
        return dict(eps=np.float32(eps))

    @classmethod
    def is_empty(cls, x, *avals, **params):
        return x.size == 0  # beta is an empty array for RMSNorm

    @classmethod
    def empty(cls, x, gamma, beta, scale, *, eps, rms, y_dtype, out_dtype, columnwise):
        avals = cls.abstract(
            *(jax.core.ShapedArray(a.shape, a.dtype) for a in (x, gamma, beta, scale)),
            eps=eps,
            rms=rms,
            y_dtype=y_dtype,
            out_dtype=out_dtype,
            columnwise=columnwise,
        )
        outs = [jnp.zeros(a.shape, a.dtype) for a in avals]
        if out_dtype is not None:
            outs[4] = 1.0 / scale
        return tuple(outs)

    @classmethod
    def local(cls, plan, *args, **params):
        y, q, q_t, amax, scale_inv, mean, rstd = cls.inner.bind(*args, **params)
        if plan:
            amax = lax.pmax(amax, plan)
        return y, q, q_t, amax, scale_inv, mean, rstd

    @classmethod
    def shardings(cls, mesh, arg_infos, *, rms, out_dtype, columnwise, **_):
        x = arg_infos[0]
        rows = [entry(a) for a in _row_axes(mesh, x, x.ndim)]
        by_row = named(mesh, *rows, None)
        codes = by_row if out_dtype is not None else named(mesh)
        q_t = named(mesh, None, rows[0]) if columnwise else named(mesh)
        stats = named(mesh, *rows)
        args = (by_row, named(mesh), named(mesh), named(mesh))
        outs = (by_row, codes, q_t, named(mesh), named(mesh), named(mesh) if rms else stats, stats)
        return args, outs, sharding.amax_axes(mesh)

    @classmethod
    def sharding_rule(cls, value_types, result_types, *, rms, out_dtype, columnwise, **_):
        r = " ".join(_factors(value_types))
        codes = f"{r} c" if out_dtype is not None else "zq"
        q_t = f"c {r}" if columnwise else "zt"
        scale_inv = "" if out_dtype is not None else "zs"
        beta, mean = ("zb", "zm") if rms else ("c", r)
        return (
            f"{r} c, c, {beta}, -> {r} c, {codes}, {q_t}, , {scale_inv}, {mean}, {r}",
            {"need_replication_factors": ("c",)},
        )


def layer_norm_fwd(x, gamma, beta, eps: float = 1e-5):
    """(y, mean, rstd): LayerNorm of float32 x over its last dimension; mean and rstd have
    shape x.shape[:-1]."""
    return tuple(LayerNormForward.bind(x, gamma, beta, eps=float(eps)))


def layer_norm_bwd(dy, x, gamma, mean, rstd):
    """(dx, dgamma, dbeta) from the output gradient dy and forward's x, gamma, mean, rstd."""
    return tuple(LayerNormBackward.bind(dy, x, gamma, mean, rstd))


def _norm_args(x, gamma, beta):
    """(x, gamma, beta as the handler takes it, rms): beta None means RMSNorm."""
    rms = beta is None
    return jnp.asarray(x), jnp.asarray(gamma), jnp.zeros((0,), F32) if rms else beta, rms


def norm_fwd_quantize(
    x,
    gamma,
    beta,
    scale,
    dtype=jnp.float8_e4m3fn,
    *,
    eps: float = 1e-5,
    columnwise: bool = False,
    y_dtype=None,
):
    """(y, Quantized, mean, rstd): LayerNorm of x (float32 or bfloat16), or RMSNorm when beta is
    None (mean is then None), and the FP8 cast of its output with `scale` (delayed scaling) in
    one pass: q = saturate(round(y * scale)) of y rounded to y_dtype (default x's dtype); amax
    = max|y| over the whole (global) array; with columnwise=True (x 2-D) q_t holds the
    transpose's codes."""
    x, gamma, beta, rms = _norm_args(x, gamma, beta)
    scale = jnp.asarray(scale)
    y, q, q_t, amax, scale_inv, mean, rstd = NormForward.bind(
        x,
        gamma,
        beta,
        scale,
        eps=float(eps),
        rms=rms,
        y_dtype=jnp.dtype(x.dtype if y_dtype is None else y_dtype),
        out_dtype=check_fp8(dtype),
        columnwise=bool(columnwise),
    )
    return y, Quantized(q, q_t, amax, scale, scale_inv), None if rms else mean, rstd


def norm_fwd_amax(x, gamma, beta, *, eps: float = 1e-5, y_dtype=None):
    """(y, amax, mean, rstd): the norm of norm_fwd_quantize without codes, with amax = max|y|
    over the whole (global) array measured in the same pass (current scaling's input)."""
    x, gamma, beta, rms = _norm_args(x, gamma, beta)
    y, _, _, amax, _, mean, rstd = NormForward.bind(
        x,
        gamma,
        beta,
        jnp.ones((), F32),
        eps=float(eps),
        rms=rms,
        y_dtype=jnp.dtype(x.dtype if y_dtype is None else y_dtype),
        out_dtype=None,
        columnwise=False,
    )
    return y, amax, None if rms else mean, rstd


def rms_norm_bwd(dy, x, gamma, rstd):
    """(dx, dgamma) of y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps), from forward's
    rstd (x.shape[:-1]), in float32 (dx in x's dtype):
    dx = rstd * (dy*gamma - x * rstd^2 * mean(dy*gamma*x)),  dgamma = sum_rows dy * x * rstd."""
    xf, dyf, r = x.astype(F32), dy.astype(F32), rstd[..., None]
    g = dyf * gamma
    dx = r * (g - xf * (r * r) * jnp.mean(g * xf, axis=-1, keepdims=True))
    dgamma = jnp.sum((dyf * xf * r).reshape(-1, x.shape[-1]), axis=0)
    return dx.astype(x.dtype), dgamma


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x, gamma, eps: float = 1e-5):
    """RMSNorm of x (float32 or bfloat16) over its last dimension on qmesh's norm op, y in x's
    dtype, differentiable (the backward is rms_norm_bwd)."""
    return norm_fwd_amax(x, gamma, None, eps=eps)[0]


def _rms_norm_fwd_rule(x, gamma, eps):
    y, _, _, rstd = norm_fwd_amax(x, gamma, None, eps=eps)
    return y, (x, gamma, rstd)


def _rms_norm_bwd_rule(eps, residuals, dy):
    return rms_norm_bwd(dy, *residuals)


rms_norm.defvjp(_rms_norm_fwd_rule, _rms_norm_bwd_rule)
