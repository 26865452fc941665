"""LayerNorm or RMSNorm fused with the FP8 cast of its output, then the FP8 dense layer, as one
differentiable JAX function, for every recipe:

    y, ln = layernorm_dense(x, gamma, beta, kernel, bias, state, recipe=DelayedScaling())
    # ln = layer_norm(x) (rms_norm(x) when beta is None); y = act(ln @ kernel + bias)

The norm handler (norm_forward) writes the normalised rows together with what the first GEMM's
input cast needs, so the norm output is read once less than "norm, then cast":
  DelayedScaling: the FP8 codes with this step's input scale, in the norm's own pass;
  Float8CurrentScaling: max|ln| in the norm's pass (the scale needs it before any code), then
    the cast of ln with the scale from it (the composition quantize_current(ln) gives);
  Float8BlockScaling: the norm, then the block cast of ln (blocks take their own amaxes; the
    amax the norm measures is not used).
Backward: the dense layer's backward (dense.py) gives the gradient of the norm output; the norm
output's own cotangent (when `ln` is used) is added, and layer_norm_bwd (rms_norm_bwd) takes
the sum to x, gamma and beta. The state is updated as dense() updates it (this step's input
amax is the norm output's global amax).

x float32 or bfloat16 (ln and y in x's dtype; the GEMM operands as dense() takes them), norm
parameters float32. Sharding: as layer_norm.py and dense.py (row_axes as in dense()).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from qmesh.jax import collective_gemm as _cgemm
from qmesh.jax import dense as _dense
from qmesh.jax.autocast import recipe_in_force
from qmesh.jax.common import F32, WIDE_DTYPES
from qmesh.jax.layer_norm import (
    layer_norm_bwd,
    norm,
    norm_fwd_amax,
    norm_fwd_quantize,
    rms_norm_bwd,
)
from qmesh.jax.quantize import current_scale, quantize
from qmesh.jax.recipe import (
    DelayedScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    check_recipe,
)


def norm_forward(cfg, eps, x, gamma, beta, step):
    """(ln [M, H], its FP8 operand for the first GEMM, mean or None for RMSNorm, rstd): the norm
    of x [..., H] (RMSNorm when beta is None) fused with the cast of its output for the first
    GEMM (dense Config `cfg`, this step's `step`)."""
    x2 = x.reshape(-1, x.shape[-1])
    recipe = cfg.recipe
    dtype = recipe.fp8_format.fwd_dtype
    columnwise = _dense.tokens_columnwise(cfg)
    if isinstance(recipe, DelayedScaling):
        return norm_fwd_quantize(x2, gamma, beta, step[1][0], dtype, eps=eps, columnwise=columnwise)
    ln, amax, mean, rstd = norm_fwd_amax(x2, gamma, beta, eps=eps)
    if not isinstance(recipe, Float8CurrentScaling):  # block-scaled: the cast after the norm
        seq_rows = _dense.sequence_rows(cfg, "x")
        return (
            ln,
            _dense._quantize(ln, None, dtype, recipe, columnwise, seq_rows=seq_rows),
            mean,
            rstd,
        )
    scale = current_scale(
        amax,
        dtype,
        power_of_two_scales=recipe.power_of_two_scales,
        amax_epsilon=recipe.amax_epsilon,
    )
    q = quantize(ln, scale, dtype, columnwise=columnwise)
    return ln, q._replace(amax=amax), mean, rstd


def norm_backward(d_ln, g_ln, x, gamma, mean, rstd):
    """(dx shaped like x, dgamma, dbeta or None for RMSNorm: mean None) from the first GEMM's
    input gradient d_ln [M, H] and the norm output's own cotangent g_ln (shaped like x)."""
    x2 = x.reshape(-1, x.shape[-1])
    d_ln = d_ln.astype(F32) + g_ln.reshape(d_ln.shape).astype(F32)
    if mean is None:
        dx, dgamma = rms_norm_bwd(d_ln, x2, gamma, rstd)
        dbeta = None
    else:
        dx, dgamma, dbeta = layer_norm_bwd(d_ln, x2.astype(F32), gamma, mean, rstd)
    return dx.astype(x.dtype).reshape(x.shape), dgamma, dbeta


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
    recipe=None,
    eps: float = 1e-6,
    activation: str | None = None,
    row_axes: tuple | None = None,
    collective_gemm: _cgemm.CollectiveGemm | str | bool | None = None,
    sr_key=None,
):
    """(act(norm(x) @ kernel + bias), norm(x)) with the norm and the FP8 cast of its output
    fused: LayerNorm, or RMSNorm when beta is None. x: float32 or bfloat16 [..., H]; gamma,
    beta: float32 [H]; kernel: [H, N]; bias: [N] or None; state: init_state(recipe) (None for
    Float8CurrentScaling and Float8BlockScaling); recipe: DelayedScaling, Float8CurrentScaling
    or Float8BlockScaling (MXFP8BlockScaling, NVFP4BlockScaling: the norm, then their emulated
    dense; None: as dense(), the autocast's; under autocast(enabled=False) the norm, then the
    high-precision dense); activation: None or "gelu"; row_axes, collective_gemm, sr_key: as
    dense(). y and norm(x) are in x's dtype. Differentiate with respect to `state` to get the
    updated state."""
    recipe = recipe_in_force(recipe, DelayedScaling())
    if recipe is None or isinstance(recipe, (MXFP8BlockScaling, NVFP4BlockScaling)):
        ln = norm(x, gamma, beta, eps)  # the norm as its own op
        y = _dense.dense(
            ln,
            kernel,
            bias,
            state,
            recipe=recipe,
            activation=activation,
            collective_gemm=collective_gemm,
            sr_key=sr_key,
        )
        return y, ln
    check_recipe(recipe)
    collective_gemm = _cgemm.of(_cgemm.in_force(collective_gemm, recipe), "column")
    _cgemm.check_recipe(collective_gemm, recipe)
    if activation not in _dense.ACTIVATIONS:
        raise ValueError(
            f"layernorm_dense: activation must be one of {_dense.ACTIVATIONS}, not {activation!r}"
        )
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    if x.dtype not in (F32, jnp.bfloat16):
        raise TypeError(f"layernorm_dense: x must be float32 or bfloat16, not {x.dtype}")
    if kernel.dtype not in WIDE_DTYPES:
        raise TypeError(
            f"layernorm_dense: kernel must be float32, bfloat16 or float16, not {kernel.dtype}"
        )
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
    cfg = _dense.Config(recipe, activation, bias is not None, x.dtype, row_axes, collective_gemm)
    return _layernorm_dense(
        cfg,
        float(eps),
        x,
        jnp.asarray(gamma),
        None if beta is None else jnp.asarray(beta),
        kernel,
        None if bias is None else jnp.asarray(bias),
        state,
    )
