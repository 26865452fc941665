"""The normalisation of qmesh's Flax modules: LayerNorm (qmesh's float32 op,
qmesh.jax.layer_norm) or RMSNorm (plain JAX math here) over the last dimension, as the module
LayerNorm (TransformerEngine's fields) and as the functions the fused modules' Norm mixin
(module.py) builds on.

    y = LayerNorm(layernorm_type="rmsnorm", zero_centered_gamma=True)(x)

    layernorm: y = (x - mean) / sqrt(var + eps) * gamma + beta   (var: biased, of the row)
    rmsnorm:   y = x / sqrt(mean(x * x) + eps) * gamma

computed in float32 whatever x's dtype, returned in x's dtype. zero_centered_gamma stores
gamma - 1 in the parameter "scale" (initialised to 0), which helps weight decay; beta is the
parameter "ln_bias" (LayerNorm only).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from qmesh.jax.flax.sharding import logical_param
from qmesh.jax.layer_norm import norm

NORMS = ("layernorm", "rmsnorm")


def norm_params(
    module: nn.Module,
    h: int,
    *,
    layernorm_type: str,
    zero_centered_gamma: bool,
    scale_init: Callable | None,
    scale_axes: tuple,
    bias_init: Callable,
    bias_axes: tuple,
    dtype=jnp.float32,
):
    """(gamma, beta) of a norm over h features, declared in `module`: the parameter "scale"
    (+ 1 with zero_centered_gamma) and, for "layernorm", "ln_bias" (None for "rmsnorm"), both
    float32 [h]; parameters stored in `dtype`."""
    if layernorm_type not in NORMS:
        raise ValueError(f"layernorm_type must be one of {NORMS}, not {layernorm_type!r}")
    init = scale_init or (nn.initializers.zeros if zero_centered_gamma else nn.initializers.ones)
    gamma = logical_param(module, "scale", init, (h,), dtype, tuple(scale_axes)).astype(jnp.float32)
    gamma = gamma + 1.0 if zero_centered_gamma else gamma
    beta = None
    if layernorm_type == "layernorm":
        beta = logical_param(module, "ln_bias", bias_init, (h,), dtype, tuple(bias_axes))
        beta = beta.astype(jnp.float32)
    return gamma, beta


def normalize(x, gamma, beta, epsilon: float):
    """LayerNorm of x over its last dimension (beta float32 [H]) or RMSNorm (beta None), in
    float32 (qmesh.jax.layer_norm.norm); the result in x's dtype."""
    if not epsilon > 0:
        raise ValueError(f"the norm's epsilon must be > 0, not {epsilon}")
    return norm(x, gamma, beta, epsilon)


class LayerNorm(nn.Module):
    """LayerNorm or RMSNorm over the last dimension (TransformerEngine's fields):
    layernorm_type ("layernorm" or "rmsnorm"), epsilon, zero_centered_gamma, scale_init
    (default ones, zeros with zero_centered_gamma) / scale_axes, bias_init / bias_axes (the
    logical axes of "scale" and "ln_bias", mapped by logical_axis_rules), dtype (of the
    parameters). Returns the normalised x in x's dtype; the rows keep their sharding, the
    normalised dimension is gathered where sharded (qmesh.jax.layer_norm)."""

    epsilon: float = 1e-6
    layernorm_type: str = "layernorm"
    zero_centered_gamma: bool = False
    scale_init: Callable | None = None
    scale_axes: tuple = ("embed",)
    bias_init: Callable = nn.initializers.zeros
    bias_axes: tuple = ("embed",)
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = jnp.asarray(x)
        if x.ndim < 1:
            raise ValueError("LayerNorm: x needs at least one dimension (the normalised one)")
        params = norm_params(
            self,
            x.shape[-1],
            layernorm_type=self.layernorm_type,
            zero_centered_gamma=self.zero_centered_gamma,
            scale_init=self.scale_init,
            scale_axes=self.scale_axes,
            bias_init=self.bias_init,
            bias_axes=self.bias_axes,
            dtype=self.dtype,
        )
        return normalize(x, *params, self.epsilon)
