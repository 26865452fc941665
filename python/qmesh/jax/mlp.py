"""The FP8 GELU MLP, fc2(gelu(fc1(x))), as one differentiable JAX function, with GELU fused into
the casts around it (and, in layernorm_mlp, LayerNorm or RMSNorm fused with fc1's input cast):

    y = mlp(x, (kernel_1, kernel_2), (bias_1, bias_2), states, recipe=recipe)
    y, ln = layernorm_mlp(x, gamma, beta, kernels, biases, states, recipe=recipe)

Forward: fc1's FP8 GEMM writes the pre-activation (its bias in the GEMM's epilogue, as
dense.py does); gelu_quantize casts GELU(pre) straight to fc2's input codes (with their
columnwise copy), so the hidden activation is never written in a wide type. Backward: fc2's
backward gives dh, the gradient of GELU's output; dgelu_dbias_quantize casts dh * gelu'(pre)
to fc1's output-gradient codes and sums it into fc1's bias gradient in the same pass, and fc1's
backward runs its GEMMs on those codes. Against dense(..., activation="gelu") followed by dense:
the forward saves a write and a read of the hidden activation, the backward a write and a read
of its gradient (activation_quantize.py). The GELU-fused casts are per-tensor: under
Float8BlockScaling the MLP computes GELU(pre) in the pre-activation's dtype and then
block-casts it (1x128 blocks), and in backward block-casts dh * gelu'(pre) with its bias
gradient (block_dbias_quantize), one more write and read each way than the fused casts.

states: (state_1, state_2), each init_state(recipe) for DelayedScaling (None for current
scaling), updated as dense() updates a state (the gradient of the state is the new state;
fc2's input amax is max|GELU(pre)|, fc1's output-gradient amax max|dh * gelu'(pre)|).
Sharding: as dense(); row_axes = (fc1's, fc2's) as dense()'s row_axes (the mesh axes the
rows of each GEMM's FP8 input are gathered to; None: as they come).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from qmesh.jax import collective_gemm as _cgemm
from qmesh.jax import dense as _dense
from qmesh.jax.activation_quantize import (
    dgelu_dbias_quantize,
    dgelu_dbias_quantize_current,
    gelu_quantize,
    gelu_quantize_current,
)
from qmesh.jax.autocast import recipe_in_force
from qmesh.jax.common import F32
from qmesh.jax.gemm import dgelu, gelu
from qmesh.jax.layer_norm import norm
from qmesh.jax.layernorm_dense import norm_backward, norm_forward
from qmesh.jax.nvfp4_dense import split_key
from qmesh.jax.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    check_recipe,
)

EMULATED = (MXFP8BlockScaling, NVFP4BlockScaling)  # recipes of two emulated dense layers


@dataclasses.dataclass(frozen=True)
class Config:
    """The static part of one MLP call: the dense Configs of fc1 (no activation: it writes the
    pre-activation) and fc2."""

    fc1: _dense.Config
    fc2: _dense.Config


def _scaling(recipe) -> dict:
    """The current-scaling keywords of the casts (empty under delayed scaling)."""
    if isinstance(recipe, DelayedScaling):
        return {}
    return dict(power_of_two_scales=recipe.power_of_two_scales, amax_epsilon=recipe.amax_epsilon)


def forward(cfg: Config, x, kernels, biases, states, xq=None, step_1=None):
    """(y, residuals): the forward pass. xq: x already quantized as [M, H] with its
    columnwise copy per dense.tokens_columnwise(cfg.fc1) (the fused LayerNorm's codes);
    step_1: fc1's step when the caller already took it."""
    recipe = cfg.fc1.recipe
    pre, res_1 = _dense.forward(cfg.fc1, x, kernels[0], biases[0], states[0], xq, step_1)
    step_2 = _dense.step_of(states[1], recipe)
    pre2 = pre.reshape(-1, pre.shape[-1])
    fwd, columnwise = recipe.fp8_format.fwd_dtype, _dense.tokens_columnwise(cfg.fc2)
    if isinstance(recipe, Float8BlockScaling):
        h = gelu(pre2.astype(F32)).astype(pre2.dtype)
        hq = _dense.block_cast(h, fwd, recipe, "x")
    elif step_2 is None:
        hq = gelu_quantize_current(pre2, fwd, columnwise=columnwise, **_scaling(recipe))
    else:
        hq = gelu_quantize(pre2, step_2[1][0], fwd, columnwise=columnwise)
    y, res_2 = _dense.forward(cfg.fc2, pre, kernels[1], biases[1], states[1], hq, step_2)
    return y, (res_1, res_2, pre2)


def backward(cfg: Config, res, g):
    """(dx, (dkernel_1, dkernel_2), (dbias_1, dbias_2), (new_state_1, new_state_2)) for the
    output gradient g [..., H] (dbias None without bias, new state None without state)."""
    res_1, res_2, pre2 = res
    dh, dk_2, db_2, state_2 = _dense.backward(cfg.fc2, res_2, g)
    dh2 = dh.reshape(pre2.shape)
    recipe = cfg.fc1.recipe
    bwd, columnwise = recipe.fp8_format.bwd_dtype, _dense.tokens_columnwise(cfg.fc1)
    scale = _dense.grad_scale(res_1)
    if isinstance(recipe, Float8BlockScaling):
        g2 = (dh2.astype(F32) * dgelu(pre2.astype(F32))).astype(dh2.dtype)
        gq, dbias = _dense.block_cast(g2, bwd, recipe, "grad", with_dbias=True)
    elif scale is None:
        gq, dbias = dgelu_dbias_quantize_current(
            dh2, pre2, bwd, columnwise=columnwise, **_scaling(recipe)
        )
    else:
        gq, dbias = dgelu_dbias_quantize(dh2, pre2, scale, bwd, columnwise=columnwise)
    dx, dk_1, db_1, state_1 = _dense.backward_quantized(
        cfg.fc1, res_1, gq, dbias if cfg.fc1.has_bias else None
    )
    dx = dx.reshape(*g.shape[:-1], dx.shape[-1])
    return dx, (dk_1, dk_2), (db_1, db_2), (state_1, state_2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mlp(cfg, x, kernels, biases, states):
    return forward(cfg, x, kernels, biases, states)[0]


_mlp.defvjp(forward, backward)


def _fused_fwd(cfg, eps, x, gamma, beta, kernels, biases, states):
    step_1 = _dense.step_of(states[0], cfg.fc1.recipe)
    ln, xq, mean, rstd = norm_forward(cfg.fc1, eps, x, gamma, beta, step_1)
    y, res = forward(cfg, ln, kernels, biases, states, xq, step_1)
    y = y.reshape(*x.shape[:-1], y.shape[-1])
    return (y, ln.reshape(x.shape)), (res, x, gamma, mean, rstd)


def _fused_bwd(cfg, eps, res, cts):
    mlp_res, x, gamma, mean, rstd = res
    g, g_ln = cts
    d_ln, dkernels, dbiases, new_states = backward(cfg, mlp_res, g.reshape(-1, g.shape[-1]))
    return (*norm_backward(d_ln, g_ln, x, gamma, mean, rstd), dkernels, dbiases, new_states)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _layernorm_mlp(cfg, eps, x, gamma, beta, kernels, biases, states):
    return _fused_fwd(cfg, eps, x, gamma, beta, kernels, biases, states)[0]


_layernorm_mlp.defvjp(_fused_fwd, _fused_bwd)


def _config(name, x, kernels, biases, states, recipe, row_axes, out_dtype, collective_gemm=None):
    """The checked Config of an MLP call (raises ValueError/TypeError naming the argument)."""
    check_recipe(recipe)
    if len(kernels) != 2 or len(biases) != 2 or len(states) != 2 or len(row_axes) != 2:
        raise ValueError(
            f"{name}: kernels, biases, states and row_axes are pairs (fc1's, fc2's), got "
            f"{len(kernels)}, {len(biases)}, {len(states)} and {len(row_axes)} entries"
        )
    k1, k2 = kernels
    h = x.shape[-1]
    if k1.ndim != 2 or k2.ndim != 2 or k1.shape[0] != h or k2.shape != (k1.shape[1], h):
        raise ValueError(
            f"{name}: kernels must be [H, F] and [F, H] for x [..., H = {h}], got "
            f"{tuple(k1.shape)} and {tuple(k2.shape)}"
        )
    for bias, n, which in ((biases[0], k1.shape[1], "bias_1"), (biases[1], h, "bias_2")):
        if bias is not None and jnp.shape(bias) != (n,):
            raise ValueError(f"{name}: {which} must be [{n}], not {list(jnp.shape(bias))}")
    for kernel, which in ((k1, "fc1"), (k2, "fc2")):
        reason = _dense.fp8_unsupported_reason(x.dtype, kernel.shape[0], kernel.shape[1])
        if reason is not None:
            raise ValueError(f"{name} ({which}): {reason}")
    for state in states:
        _dense.check_state(state, recipe)

    _cgemm.check_recipe(collective_gemm, recipe)

    def layer(bias, axes, parallel):
        ring = _cgemm.of(collective_gemm, parallel)
        axes = None if axes is None or ring is not None else tuple(axes)
        return _dense.Config(recipe, None, bias is not None, out_dtype, axes, ring)

    return Config(layer(biases[0], row_axes[0], "column"), layer(biases[1], row_axes[1], "row"))


def mlp(
    x,
    kernels,
    biases=(None, None),
    states=(None, None),
    *,
    recipe=None,
    row_axes=(None, None),
    collective_gemm: str | bool | None = None,
    sr_key=None,
):
    """fc2(gelu(fc1(x))) with FP8 GEMMs and GELU fused into the casts. x: [..., H] (float32,
    bfloat16 or float16); kernels: ([H, F], [F, H]) in x's dtype; biases: ([F] or None, [H] or
    None); states: init_state(recipe) of each GEMM (None for Float8CurrentScaling and
    Float8BlockScaling); recipe: DelayedScaling, Float8CurrentScaling or Float8BlockScaling
    (GELU then the block cast: the GELU-fused casts are per-tensor), or MXFP8BlockScaling /
    NVFP4BlockScaling (two emulated dense layers, GELU between; no states, row_axes have no
    effect); None: as dense(), the
    autocast's (high precision under autocast(enabled=False)); row_axes: (fc1's, fc2's), as
    dense(); collective_gemm: None or an overlap ("none", "ring", "bidir"): fc1 column parallel
    and fc2 row parallel through qmesh's rings (collective_gemm.py); None takes the autocast's
    (autocast(collective_gemm=...)); False: XLA's collectives; sr_key: NVFP4's key of the
    stochastic rounding (as dense(); each layer gets a key split from it). Returns y [..., H]
    in x's dtype. Differentiate with respect to `states` for the updated states."""
    recipe = recipe_in_force(recipe, DelayedScaling())
    collective_gemm = _cgemm.in_force(collective_gemm, recipe)
    if recipe is None:
        _cgemm.check_quantized(collective_gemm, recipe)
        h = _dense.dense(x, kernels[0], biases[0], states[0], activation="gelu")
        return _dense.dense(h, kernels[1], biases[1], states[1])
    if isinstance(recipe, EMULATED):
        _cgemm.check_recipe(collective_gemm, recipe)
        if any(s is not None for s in states):
            raise ValueError(f"mlp: {type(recipe).__name__} takes no states")
        keys = split_key(sr_key, 2)
        h = _dense.dense(x, kernels[0], biases[0], recipe=recipe, activation="gelu", sr_key=keys[0])
        return _dense.dense(h, kernels[1], biases[1], recipe=recipe, sr_key=keys[1])
    x = jnp.asarray(x)
    kernels = tuple(jnp.asarray(k) for k in kernels)
    biases = tuple(None if b is None else jnp.asarray(b) for b in biases)
    cfg = _config(
        "mlp", x, kernels, biases, tuple(states), recipe, row_axes, x.dtype, collective_gemm
    )
    return _mlp(cfg, x, kernels, biases, tuple(states))


def layernorm_mlp(
    x,
    gamma,
    beta,
    kernels,
    biases=(None, None),
    states=(None, None),
    *,
    recipe=None,
    eps: float = 1e-6,
    row_axes=(None, None),
    collective_gemm: str | bool | None = None,
    sr_key=None,
):
    """(mlp(norm(x)), norm(x)) with the norm (LayerNorm, or RMSNorm when beta is None) fused
    with fc1's input cast as layernorm_dense fuses it, for every recipe. x: float32 or bfloat16
    [..., H]; gamma, beta: float32 [H]; the other arguments as mlp()."""
    recipe = recipe_in_force(recipe, DelayedScaling())
    if recipe is None or isinstance(recipe, EMULATED):  # the norm as its own op
        ln = norm(x, gamma, beta, eps)
        y = mlp(
            ln,
            kernels,
            biases,
            states,
            recipe=recipe,
            row_axes=row_axes,
            collective_gemm=collective_gemm,
            sr_key=sr_key,
        )
        return y, ln
    collective_gemm = _cgemm.in_force(collective_gemm, recipe)
    x = jnp.asarray(x)
    if x.dtype not in (F32, jnp.bfloat16):
        raise TypeError(f"layernorm_mlp: x must be float32 or bfloat16, not {x.dtype}")
    kernels = tuple(jnp.asarray(k) for k in kernels)
    biases = tuple(None if b is None else jnp.asarray(b) for b in biases)
    cfg = _config(
        "layernorm_mlp",
        x,
        kernels,
        biases,
        tuple(states),
        recipe,
        row_axes,
        x.dtype,
        collective_gemm,
    )
    beta = None if beta is None else jnp.asarray(beta)
    return _layernorm_mlp(
        cfg, float(eps), x, jnp.asarray(gamma), beta, kernels, biases, tuple(states)
    )
