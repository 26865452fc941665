"""LayerNorm fused with the FP8 cast of its output, then the FP8 dense layer, as one
differentiable JAX function (delayed scaling):

    y, ln = layernorm_dense(x, gamma, beta, kernel, bias, state, recipe=DelayedScaling())
    # ln = layer_norm(x); y = act(ln @ kernel + bias)

The LayerNorm handler writes the normalised rows and their FP8 codes (with this step's
input scale) in one pass (layer_norm_fwd_quantize), so the norm output is not read a second
time to be quantized; the GEMM takes those codes. Backward: the dense layer's backward
(dense.py) gives the gradient of the norm output; the norm output's own cotangent (when `ln`
is used) is added, and layer_norm_bwd takes the sum to x, gamma and beta. The state is updated
as dense() updates it (this step's input amax is the norm output's global amax).

DelayedScaling only (current scaling needs the amax before the cast), float32 x and
parameters (qmesh's LayerNorm is float32-only). Sharding: as layer_norm.py and dense.py
(row_axes as in dense()).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from qmesh.jax import collective_gemm as _cgemm
from qmesh.jax import dense as _dense
from qmesh.jax.common import F32
from qmesh.jax.layer_norm import layer_norm_bwd, layer_norm_fwd_quantize
from qmesh.jax.recipe import DelayedScaling


def norm_forward(cfg, eps, x, gamma, beta, step):
    """(ln [M, H], its Quantized codes, mean, rstd): LayerNorm of x [..., H] fused with the
    cast of its output for the first GEMM (dense Config `cfg`, this step's `step`)."""
    return layer_norm_fwd_quantize(
        x.reshape(-1, x.shape[-1]),
        gamma,
        beta,
        step[1][0],
        cfg.recipe.fp8_format.fwd_dtype,
        eps=eps,
        columnwise=_dense.tokens_columnwise(cfg),
    )


def norm_backward(d_ln, g_ln, x, gamma, mean, rstd):
    """(dx shaped like x, dgamma, dbeta) from the first GEMM's input gradient d_ln [M, H] and
    the norm output's own cotangent g_ln (shaped like x)."""
    x2 = x.reshape(-1, x.shape[-1])
    d_ln = d_ln.astype(F32) + g_ln.reshape(d_ln.shape).astype(F32)
    dx, dgamma, dbeta = layer_norm_bwd(d_ln, x2, gamma, mean, rstd)
    return dx.reshape(x.shape), dgamma, dbeta


def _fwd(cfg, eps, x, gamma, beta, kernel, bias, state):
    step = _dense.step_of(state, cfg.recipe)
    ln, xq, mean, rstd = norm_forward(cfg, eps, x, gamma, beta, step)
    y, dense_res = _dense.forward(cfg, ln, kernel, bias, state, xq, step)
    y = y.reshape(*x.shape[:-1], y.shape[-1])
    return (y, ln.reshape(x.shape)), (dense_res, x, gamma, mean, rstd)


def _bwd(cfg, eps, res, cts):
    dense_res, x, gamma, mean, rstd = res
    g, g_ln = cts
    d_ln, dw, db, new_state = _dense.backward(cfg, dense_res, g.reshape(-1, g.shape[-1]))
    return (*norm_backward(d_ln, g_ln, x, gamma, mean, rstd), dw, db, new_state)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _layernorm_dense(cfg, eps, x, gamma, beta, kernel, bias, state):
    return _fwd(cfg, eps, x, gamma, beta, kernel, bias, state)[0]


_layernorm_dense.defvjp(_fwd, _bwd)


def layernorm_dense(
    x,
    gamma,
    beta,
    kernel,
    bias=None,
    state=None,
    *,
    recipe,
    eps: float = 1e-6,
    activation: str | None = None,
    row_axes: tuple | None = None,
    collective_gemm: _cgemm.CollectiveGemm | None = None,
):
    """(act(layer_norm(x) @ kernel + bias), layer_norm(x)) with the norm and the FP8 cast of
    its output fused. x: float32 [..., H]; gamma, beta: float32 [H]; kernel: float32 [H, N];
    bias: [N] or None; state: init_state(recipe); recipe: a DelayedScaling; activation: None
    or "gelu"; row_axes, collective_gemm: as dense(). Differentiate with respect to `state`
    to get the updated state."""
    if not isinstance(recipe, DelayedScaling):
        raise TypeError(
            f"layernorm_dense: the fused LayerNorm+cast takes a DelayedScaling "
            f"recipe (the scale comes from the state), not {type(recipe).__name__}"
        )
    if activation not in _dense.ACTIVATIONS:
        raise ValueError(
            f"layernorm_dense: activation must be one of {_dense.ACTIVATIONS}, not {activation!r}"
        )
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    for a, what in ((x, "x"), (kernel, "kernel")):
        if a.dtype != F32:
            raise TypeError(f"layernorm_dense: {what} must be float32, not {a.dtype}")
    if kernel.ndim != 2 or x.ndim < 1 or x.shape[-1] != kernel.shape[0]:
        raise ValueError(
            f"layernorm_dense: x must be [..., H] and kernel [H, N] with the same "
            f"H, got x {tuple(x.shape)} and kernel {tuple(kernel.shape)}"
        )
    reason = _dense.fp8_unsupported_reason(x.dtype, kernel.shape[0], kernel.shape[1])
    if reason is not None:
        raise ValueError(reason)
    if bias is not None and jnp.shape(bias) != (kernel.shape[1],):
        raise ValueError(
            f"layernorm_dense: bias must be [N] = [{kernel.shape[1]}], not {list(jnp.shape(bias))}"
        )
    _dense.check_state(state, recipe)
    row_axes = None if row_axes is None or collective_gemm is not None else tuple(row_axes)
    cfg = _dense.Config(recipe, activation, bias is not None, F32, row_axes, collective_gemm)
    return _layernorm_dense(
        cfg,
        float(eps),
        x,
        jnp.asarray(gamma),
        jnp.asarray(beta),
        kernel,
        None if bias is None else jnp.asarray(bias, F32),
        state,
    )
