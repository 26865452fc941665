"""TransformerEngine-style Flax modules on qmesh's FP8 dense op: DenseGeneral,
LayerNormDenseGeneral, LayerNormMLP and Softmax, with LoRA on the dense modules. The
quantized modules derive from QuantizedModule (the fields and the dense computation they
share) and the mixins Norm and LoRA; the fields these add are keyword-only.

Names and arguments follow TransformerEngine's Flax modules. `recipe` picks the FP8 recipe
(qmesh.jax.recipe.DelayedScaling(), Float8CurrentScaling(), Float8BlockScaling() or
MXFP8BlockScaling() with emulated GEMMs, sizes multiples of 32; NVFP4BlockScaling() with
emulated GEMMs, sizes multiples of 16, its stochastic rounding keyed by the rng stream
"sr_rng": rngs={"params": ..., "sr_rng": ...}); None runs
the layer unquantised in `dtype` (the baseline), unless an autocast block sets a recipe
(qmesh.jax.autocast). DelayedScaling state lives in the
`_overwrite_with_gradient` collection (see dot_general.py).

Sharding (the policy is in sharding.py): parameters carry logical axis names (kernel_axes,
bias_axes, ...); `logical_axis_rules(resource)` maps them onto the mesh axes of a
MeshResource: column parallel for fc1/QKV ("mlp", "joined_kv", "heads" -> tp), row parallel
for fc2/projections (their input dimension). qmesh's primitives sum what a sharded
contracting dimension leaves partial.

Activations: under a mesh in context (jax.set_mesh) and a MeshResource naming tp or tpsp, the
LayerNorm modules constrain their activations the TransformerEngine way (logical axes, mapped
by the same rules): the input, the LayerNorm output and LayerNormMLP's output
("batch", "seq", "embed"), sequence-sharded over tpsp; the first GEMM's input
("batch", None, "embed"), gathered (as FP8 codes in FP8 mode: dense's row_axes); the hidden
activation ("batch", None, "mlp"), sharded over tp. fc2 is row parallel over tp, so with
tpsp = tp its product is reduce-scattered back to sequence-sharded (gemm.py) and nothing is
all-reduced. Without a mesh in context, or without tp/tpsp, nothing is constrained.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from qmesh.jax import collective_gemm as _cgemm
from qmesh.jax.autocast import recipe_in_force
from qmesh.jax.dense import FALLBACKS, dense, fp8_unsupported_reason
from qmesh.jax.flax.layer_norm import norm_params, normalize
from qmesh.jax.flax.sharding import (
    DOT_1_INPUT_AXES,
    HIDDEN_AXES,
    SEQ_AXES,
    activation_spec,
    check_divisible,
    constrain_activation,
    logical_param,
    rows_of,
    token_layout,
)
from qmesh.jax.flax.state_module import fp8_state, sr_key
from qmesh.jax.gemm import gelu
from qmesh.jax.layernorm_dense import layernorm_dense
from qmesh.jax.mlp import layernorm_mlp, mlp
from qmesh.jax.recipe import MXFP8BlockScaling, NVFP4BlockScaling, check_recipe
from qmesh.jax.sharding import constrain

ACTIVATIONS: dict[str, Callable] = {
    "gelu": gelu,
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "linear": lambda x: x,
}
SOFTMAX_TYPES = ("scaled", "scaled_masked", "scaled_upper_triang_masked")


def _tuple(v) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def _normalize_axes(axis, ndim: int) -> tuple:
    """`axis` (an int or a tuple) as non-negative dimensions of an ndim-D input; raises for an
    axis outside [-ndim, ndim) or a repeated one."""
    axes = _tuple(axis)
    bad = [a for a in axes if not -ndim <= a < ndim]
    if bad:
        raise ValueError(
            f"axis {bad[0]} is out of range for a {ndim}-D input (allowed: {-ndim}..{ndim - 1})"
        )
    axes = tuple(a % ndim for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"axis {axis!r} names a dimension twice")
    return axes


class QuantizedModule(nn.Module):
    """The fields and the dense computation every quantized module shares (keyword-only):
    kernel_init / bias_init (default: variance scaling, zeros), dtype (of the parameters and
    the computation), recipe (None: unquantised, the baseline), fallback (None or "bf16", as
    dense()), collective_gemm ("none", "ring", "bidir": the sequence-parallel GEMMs through
    qmesh's rings, qmesh.jax.collective_gemm, needs an FP8 recipe; False: XLA's collectives;
    None: the autocast's, autocast(collective_gemm=...), else XLA's)."""

    _: dataclasses.KW_ONLY
    kernel_init: Callable | None = None
    bias_init: Callable = nn.initializers.zeros
    dtype: Any = jnp.float32
    recipe: Any = None
    fallback: str | None = None
    collective_gemm: str | bool | None = None

    @property
    def lora_enabled(self) -> bool:
        """Whether a low-rank adapter runs beside the (then frozen) kernel (see LoRA)."""
        return False

    @property
    def _recipe(self):
        """`recipe`, else the autocast's (qmesh.jax.autocast); None: unquantised."""
        return recipe_in_force(self.recipe, None)

    def _check_config(self):
        if self.recipe is not None:
            check_recipe(self.recipe)
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be None or 'bf16', not {self.fallback!r}")
        if self.collective_gemm not in (None, False):
            _cgemm.check_overlap(self.collective_gemm)
            if self._recipe is None:
                raise ValueError(
                    "collective_gemm runs the FP8 GEMMs: set an FP8 recipe (the module's or "
                    "an autocast's)"
                )

    def _param(self, name, init, shape, dtype, axes):
        """The parameter `name`, partitioned by its logical axes (one per dimension, or ())."""
        return logical_param(self, name, init, shape, dtype, axes)

    def _matmul(
        self, x, kernel, bias, prefix="", activation=None, input_spec=None, parallel="column"
    ):
        """act(x @ kernel + bias) for x [..., K] and kernel [K, N]: the FP8 dense op, or plain
        math in x's dtype when the module has no recipe. input_spec: the mesh axes x's rows
        are gathered to in front of the GEMM (the FP8 codes in FP8 mode), None for as they
        come. parallel: the layer's tensor-parallel role for collective_gemm ("column" or
        "row")."""
        if self._recipe is None:
            if input_spec is not None:
                x = constrain(x, (*input_spec[:-1], jax.sharding.PartitionSpec.UNCONSTRAINED))
            y = jnp.matmul(x, kernel.astype(x.dtype), preferred_element_type=jnp.float32)
            y = y + (0 if bias is None else bias.astype(jnp.float32))
            return (gelu(y) if activation == "gelu" else y).astype(x.dtype)
        return dense(
            x,
            kernel.astype(x.dtype),
            None if bias is None else bias.astype(x.dtype),
            fp8_state(self, self._recipe, prefix),
            recipe=self._recipe,
            activation=activation,
            fallback=self.fallback,
            row_axes=rows_of(input_spec),
            collective_gemm=self._ring(parallel),
            sr_key=sr_key(self, self._recipe),
        )

    def _ring(self, parallel):
        """The CollectiveGemm of this module's GEMM in role `parallel` ("column" or "row"):
        the field's, else the autocast's; False (XLA's collectives) when none, so that dense()
        does not take the autocast's in the column role."""
        ring = _cgemm.of(_cgemm.in_force(self.collective_gemm, self._recipe), parallel)
        return False if ring is None else ring

    def _dense_general(
        self,
        x,
        features: tuple,
        axis: tuple,
        prefix="",
        activation=None,
        kernel_axes=(),
        bias_axes=(),
        input_spec=None,
        parallel="column",
    ):
        """The DenseGeneral computation shared by the modules: contracts `axis` of x with a
        kernel (*x.shape[axis], *features); returns [...rest of x, *features]. input_spec: x's
        activation spec (one entry per dimension) whose rows (the dimensions not contracted)
        the GEMM's input is gathered to (see _matmul), or None."""
        axis = tuple(a % x.ndim for a in axis)
        rest = [d for d in range(x.ndim) if d not in axis]
        in_shape = tuple(x.shape[a] for a in axis)
        k = math.prod(in_shape)
        kernel, bias = self._dense_params(in_shape, features, prefix, kernel_axes, bias_axes)
        x2 = jnp.transpose(x, rest + list(axis)).reshape(*(x.shape[d] for d in rest), k)
        rows_spec = None if input_spec is None else (*(input_spec[d] for d in rest), None)
        y = self._matmul(
            x2.astype(self.dtype), kernel, bias, prefix, activation, rows_spec, parallel
        )
        if self.lora_enabled:
            if activation is not None:
                raise ValueError("LoRA is applied before the activation: use activation=None")
            y = y + self._lora(x2.astype(self.dtype), k, kernel.shape[1], prefix)
        return y.reshape(*(x.shape[d] for d in rest), *features)

    def _dense_params(self, in_shape: tuple, features: tuple, prefix, kernel_axes, bias_axes):
        """The kernel (*in_shape, *features) as [K, N] and the bias [N] (or None) of a dense
        computation; both frozen (stop_gradient) when the module has LoRA enabled."""
        k, n = math.prod(in_shape), math.prod(features)
        for size, ax in zip(features, kernel_axes[len(in_shape) :]):
            check_divisible(size, (ax,), f"{prefix or ''}features")
        init = self.kernel_init or nn.initializers.variance_scaling(
            1.0,
            "fan_in",
            "truncated_normal",
            in_axis=tuple(range(len(in_shape))),
            out_axis=tuple(range(len(in_shape), len(in_shape) + len(features))),
        )
        kernel = self._param(
            prefix + "kernel", init, in_shape + features, self.dtype, tuple(kernel_axes)
        )
        bias = None
        if self.use_bias:
            bias = self._param(
                prefix + "bias", self.bias_init, features, self.dtype, tuple(bias_axes)
            ).reshape(n)
        kernel = kernel.reshape(k, n)
        if self.lora_enabled:
            # the base layer is frozen: only the adapter receives gradients
            kernel = lax.stop_gradient(kernel)
            bias = None if bias is None else lax.stop_gradient(bias)
        return kernel, bias


class LoRA(nn.Module):
    """Mixin: a low-rank adapter beside a dense module's kernel (keyword-only fields):
    enable_low_rank_adaptation, low_rank_adaptation_dim (r), low_rank_adaptation_alpha (the
    contribution is scaled by alpha / r; None: 1)."""

    _: dataclasses.KW_ONLY
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None

    @property
    def lora_enabled(self) -> bool:
        return self.enable_low_rank_adaptation

    def _lora(self, x, k: int, n: int, prefix=""):
        """The low-rank adapter's contribution (x @ A) @ B * alpha / r (B starts at zero)."""
        r = self.low_rank_adaptation_dim
        if r <= 0:
            raise ValueError(f"low_rank_adaptation_dim must be > 0 with LoRA enabled, not {r}")
        a = self.param(
            prefix + "lora_a_kernel",
            nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"),
            (k, r),
            self.dtype,
        )
        b = self.param(prefix + "lora_b_kernel", nn.initializers.zeros, (r, n), self.dtype)
        scale = (self.low_rank_adaptation_alpha / r) if self.low_rank_adaptation_alpha else 1.0
        return (x @ a.astype(x.dtype)) @ b.astype(x.dtype) * jnp.asarray(scale, x.dtype)


class Norm(nn.Module):
    """Mixin: LayerNorm or RMSNorm in front of the first GEMM (keyword-only fields):
    layernorm_type ("layernorm" or "rmsnorm"), epsilon, zero_centered_gamma (gamma stored as
    gamma - 1), scale_init / scale_axes, ln_bias_init / ln_bias_axes (LayerNorm's beta),
    return_layernorm_output."""

    _: dataclasses.KW_ONLY
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Callable | None = None
    scale_axes: tuple = ("embed",)
    ln_bias_init: Callable = nn.initializers.zeros
    ln_bias_axes: tuple = ("embed",)
    return_layernorm_output: bool = False

    def _norm_params(self, h: int):
        """(gamma, beta): the scale (+ 1 with zero_centered_gamma) and, for LayerNorm,
        ln_bias (None for RMSNorm), float32 [h] (flax/layer_norm.py)."""
        return norm_params(
            self,
            h,
            layernorm_type=self.layernorm_type,
            zero_centered_gamma=self.zero_centered_gamma,
            scale_init=self.scale_init,
            scale_axes=self.scale_axes,
            bias_init=self.ln_bias_init,
            bias_axes=self.ln_bias_axes,
        )

    def _norm(self, x, params):
        """LayerNorm (qmesh's float32 op) or RMSNorm of x over the last dimension with
        params = _norm_params(...)."""
        return normalize(x, *params, self.epsilon)

    def _fuses_norm(self, x, n: int) -> bool:
        """Whether the norm and the FP8 cast of its output run as one op in front of the first
        GEMM (layernorm_dense): an FP8 recipe with per-tensor or block scales (not MXFP8 or
        NVFP4, whose casts take no norm), float32 or bfloat16 input in the module's dtype, no
        LoRA, and a GEMM FP8 can take."""
        return (
            self._recipe is not None
            and not isinstance(self._recipe, (MXFP8BlockScaling, NVFP4BlockScaling))
            and x.dtype in (jnp.float32, jnp.bfloat16)
            and x.dtype == jnp.dtype(self.dtype)
            and not self.lora_enabled
            and fp8_unsupported_reason(x.dtype, x.shape[-1], n) is None
        )

    def _norm_dense(self, x, seq_spec, dot_spec, kernel, bias, prefix="", activation=None):
        """(act(norm(x) @ kernel + bias) [..., N], norm(x)): fused where _fuses_norm says so,
        else the norm, then _matmul."""
        params = self._norm_params(x.shape[-1])
        if self._fuses_norm(x, kernel.shape[1]):
            y, ln = layernorm_dense(
                x,
                *params,
                kernel.astype(x.dtype),
                None if bias is None else bias.astype(x.dtype),
                fp8_state(self, self._recipe, prefix),
                recipe=self._recipe,
                eps=self.epsilon,
                activation=activation,
                row_axes=rows_of(dot_spec),
                collective_gemm=self._ring("column"),
            )
            return y, constrain_activation(ln, seq_spec)
        ln = constrain_activation(self._norm(x, params), seq_spec)
        return self._matmul(ln.astype(self.dtype), kernel, bias, prefix, activation, dot_spec), ln


class DenseGeneral(LoRA, QuantizedModule):
    """y = x . kernel (+ bias) over `axis` of x; kernel shape (*x.shape[axis], *features).

    input_axes / output_axes: logical axes of the input / output activations (one per
    dimension; () constrains nothing), applied as the LayerNorm modules' (under a mesh and a
    MeshResource naming tp or tpsp). A row-parallel projection under sequence parallelism:
    input_axes=("batch", None, "heads", "kv"), output_axes=("batch", "seq", "embed"), its
    product reduce-scattered straight to sequence shards. With collective_gemm, a DenseGeneral
    whose output is sequence-sharded so is row parallel, any other column parallel."""

    features: int | tuple
    axis: int | tuple = -1
    use_bias: bool = True
    kernel_axes: tuple = ()
    bias_axes: tuple = ()
    input_axes: tuple = ()
    output_axes: tuple = ()

    @nn.compact
    def __call__(self, inputs):
        self._check_config()
        features, nd = _tuple(self.features), inputs.ndim
        axis = _normalize_axes(self.axis, nd)
        in_spec = activation_spec(self.input_axes, (), nd, "input_axes")
        out_spec = activation_spec(
            self.output_axes, (), nd - len(axis) + len(features), "output_axes"
        )
        # A sequence-sharded output of [batch, seq, ...] rows: the token layout of token_layout.
        sp = out_spec if min(axis) >= 2 else None
        x, (_, in_t, out_t), leave = token_layout(inputs, sp, in_spec, sp, in_spec=in_spec)
        y = self._dense_general(
            x,
            features,
            tuple(a - nd for a in axis),
            kernel_axes=self.kernel_axes,
            bias_axes=self.bias_axes,
            input_spec=in_t,
            parallel="row" if sp is not None and sp[1] is not None else "column",
        )
        return constrain_activation(leave(constrain_activation(y, out_t)), out_spec)


class LayerNormDenseGeneral(Norm, LoRA, QuantizedModule):
    """norm(x) . kernel (+ bias): LayerNorm or RMSNorm in front of a DenseGeneral over the last
    dimension. Returns (y, normalised x or None). layernorm_input_axes (input and LayerNorm
    output; default ("batch", "seq", "embed")) and dot_input_axes (the GEMM's gathered input;
    ("batch", None, "embed")) constrain the activations as in LayerNormMLP."""

    features: int | tuple
    use_bias: bool = False
    kernel_axes: tuple = ()
    bias_axes: tuple = ()
    layernorm_input_axes: tuple | None = None
    dot_input_axes: tuple | None = None

    @nn.compact
    def __call__(self, inputs):
        self._check_config()
        seq = activation_spec(
            self.layernorm_input_axes, SEQ_AXES, inputs.ndim, "layernorm_input_axes"
        )
        dot = activation_spec(self.dot_input_axes, DOT_1_INPUT_AXES, inputs.ndim, "dot_input_axes")
        x, (seq_t, dot), leave = token_layout(inputs, seq, dot)
        features = _tuple(self.features)
        if self.lora_enabled:
            ln = constrain_activation(self._norm(x, self._norm_params(x.shape[-1])), seq_t)
            y = self._dense_general(
                ln,
                features,
                (-1,),
                kernel_axes=self.kernel_axes,
                bias_axes=self.bias_axes,
                input_spec=dot,
            )
        else:
            kernel, bias = self._dense_params(
                (x.shape[-1],), features, "", self.kernel_axes, self.bias_axes
            )
            y, ln = self._norm_dense(x, seq_t, dot, kernel, bias)
            y = y.reshape(*x.shape[:-1], *features)
        ln = constrain_activation(leave(ln), seq) if self.return_layernorm_output else None
        return leave(y), ln


class LayerNormMLP(Norm, QuantizedModule):
    """norm -> fc1 -> activation -> fc2. activations: ("gelu",), ("relu",), ("silu",), or a
    gated pair such as ("silu", "linear") (SwiGLU) / ("gelu", "linear") (GeGLU): fc1 then has
    one output block per entry and the blocks are multiplied. fc1 is column parallel ("mlp"
    sharded), fc2 row parallel. Returns (y, normalised x or None).

    Activation sharding (see the module docstring): layernorm_input_axes (input, LayerNorm
    output and y; default ("batch", "seq", "embed")), dot_1_input_axes (fc1's gathered input;
    ("batch", None, "embed")), dot_2_input_axes (the hidden activation; ("batch", None, "mlp")):
    logical axes, one per dimension of the input; None takes the default for 3-D inputs (no
    constraint for other ranks), () constrains nothing."""

    intermediate_dim: int = 2048
    activations: tuple = ("gelu",)
    use_bias: bool = True
    kernel_axes_1: tuple = ("embed", "act", "mlp")
    kernel_axes_2: tuple = ("mlp", "embed")
    bias_axes_1: tuple = ("act", "mlp")
    bias_axes_2: tuple = ("embed",)
    layernorm_input_axes: tuple | None = None
    dot_1_input_axes: tuple | None = None
    dot_2_input_axes: tuple | None = None

    @nn.compact
    def __call__(self, inputs):
        self._check_config()
        acts = _tuple(self.activations)
        if not 1 <= len(acts) <= 2 or any(a not in ACTIVATIONS for a in acts):
            raise ValueError(
                f"activations must be one or two of {sorted(ACTIVATIONS)}, not {self.activations!r}"
            )
        check_divisible(self.intermediate_dim, ("mlp",), "intermediate_dim")
        nd = inputs.ndim
        seq = activation_spec(self.layernorm_input_axes, SEQ_AXES, nd, "layernorm_input_axes")
        dot1 = activation_spec(self.dot_1_input_axes, DOT_1_INPUT_AXES, nd, "dot_1_input_axes")
        dot2 = activation_spec(self.dot_2_input_axes, HIDDEN_AXES, nd, "dot_2_input_axes")
        x, (seq_t, dot1, dot2), leave = token_layout(inputs, seq, dot1, dot2)
        h, i, n_act = inputs.shape[-1], self.intermediate_dim, len(acts)
        init = self.kernel_init or nn.initializers.variance_scaling(
            1.0, "fan_in", "truncated_normal", in_axis=0, out_axis=(1, 2)
        )
        k1 = self._param("wi_kernel", init, (h, n_act, i), self.dtype, tuple(self.kernel_axes_1))
        b1 = (
            self._param("wi_bias", self.bias_init, (n_act, i), self.dtype, tuple(self.bias_axes_1))
            if self.use_bias
            else None
        )
        # [h, i, n_act] flattened keeps the "mlp" sharding on the major factor of i * n_act.
        k1 = jnp.transpose(k1, (0, 2, 1)).reshape(h, i * n_act)
        b1 = None if b1 is None else b1.T.reshape(i * n_act)
        if self._fuses_mlp(x, acts):
            y, ln = self._fused_mlp(x, k1, b1, (seq_t, dot1, dot2))
            y = constrain_activation(y, seq_t)
            y = constrain_activation(leave(y), seq)
            ln = constrain_activation(leave(ln), seq) if self.return_layernorm_output else None
            return y, ln
        fused = acts == ("gelu",) and b1 is not None  # bias + GELU in the GEMM's epilogue
        z, ln = self._norm_dense(x, seq_t, dot1, k1, b1, "wi_", "gelu" if fused else None)
        z = z.reshape(*z.shape[:-1], i, n_act)
        if not fused:
            z = ACTIVATIONS[acts[0]](z[..., 0]) * (
                ACTIVATIONS[acts[1]](z[..., 1]) if n_act == 2 else 1
            )
        else:
            z = z[..., 0]
        k2, b2 = self._fc2_params(h)
        z = constrain_activation(z, dot2)
        y = self._matmul(z.astype(self.dtype), k2, b2, "wo_", input_spec=dot2, parallel="row")
        y = constrain_activation(y, seq_t)
        y = constrain_activation(leave(y), seq)
        ln = constrain_activation(leave(ln), seq) if self.return_layernorm_output else None
        return y, ln

    def _fc2_params(self, h: int):
        """fc2's kernel [intermediate_dim, h] and bias [h] (None without bias)."""
        init = self.kernel_init or nn.initializers.variance_scaling(
            1.0, "fan_in", "truncated_normal"
        )
        k2 = self._param(
            "wo_kernel", init, (self.intermediate_dim, h), self.dtype, tuple(self.kernel_axes_2)
        )
        b2 = (
            self._param("wo_bias", self.bias_init, (h,), self.dtype, tuple(self.bias_axes_2))
            if self.use_bias
            else None
        )
        return k2, b2

    def _fuses_mlp(self, x, acts) -> bool:
        """Whether fc1, GELU and fc2 run as the fused FP8 MLP (qmesh.jax.mlp: GELU inside the
        casts around it): an FP8 recipe, the one activation GELU, GEMMs FP8 can take."""
        h, i = x.shape[-1], self.intermediate_dim
        return (
            self._recipe is not None
            and acts == ("gelu",)
            and fp8_unsupported_reason(self.dtype, h, i) is None
            and fp8_unsupported_reason(self.dtype, i, h) is None
        )

    def _fused_mlp(self, x, k1, b1, specs):
        """(y, norm(x)) through the fused MLP, with the norm fused into fc1's input cast where
        _fuses_norm says so. specs: (the token layout's sequence spec, fc1's and fc2's input
        specs)."""
        seq_t, dot1, dot2 = specs
        norm = self._norm_params(x.shape[-1])
        k2, b2 = self._fc2_params(x.shape[-1])
        dtype = self.dtype
        kernels = (k1.astype(dtype), k2.astype(dtype))
        biases = tuple(None if b is None else b.astype(dtype) for b in (b1, b2))
        states = (fp8_state(self, self._recipe, "wi_"), fp8_state(self, self._recipe, "wo_"))
        row_axes = (rows_of(dot1), rows_of(dot2))
        if self._fuses_norm(x, self.intermediate_dim):
            y, ln = layernorm_mlp(
                x,
                *norm,
                kernels,
                biases,
                states,
                recipe=self._recipe,
                eps=self.epsilon,
                row_axes=row_axes,
                collective_gemm=self.collective_gemm,
            )
            return y, constrain_activation(ln, seq_t)
        ln = constrain_activation(self._norm(x, norm), seq_t)
        y = mlp(
            ln.astype(dtype),
            kernels,
            biases,
            states,
            recipe=self._recipe,
            row_axes=row_axes,
            collective_gemm=self.collective_gemm,
            sr_key=sr_key(self, self._recipe),
        )
        return y, ln


class Softmax(nn.Module):
    """softmax(scale_factor * x) over the last dimension, in float32. softmax_type "scaled";
    "scaled_masked" (mask: True where a position is masked out); "scaled_upper_triang_masked"
    (causal: query i sees keys <= i)."""

    scale_factor: float = 1.0
    softmax_type: str = "scaled"

    @nn.compact
    def __call__(self, inputs, mask=None, bias=None):
        if self.softmax_type not in SOFTMAX_TYPES:
            raise ValueError(
                f"softmax_type must be one of {SOFTMAX_TYPES}, not {self.softmax_type!r}"
            )
        x = inputs.astype(jnp.float32) * self.scale_factor
        if bias is not None:
            x = x + bias.astype(jnp.float32)
        if self.softmax_type == "scaled_masked":
            if mask is None:
                raise ValueError("softmax_type 'scaled_masked' needs a mask")
            x = jnp.where(mask, -jnp.inf, x)
        elif self.softmax_type == "scaled_upper_triang_masked":
            q, k = x.shape[-2:]
            x = jnp.where(jnp.triu(jnp.ones((q, k), bool), 1), -jnp.inf, x)
        m = jnp.max(x, axis=-1, keepdims=True)
        e = jnp.exp(x - jnp.where(jnp.isfinite(m), m, 0))
        s = jnp.sum(e, axis=-1, keepdims=True)
        return jnp.where(s > 0, e / jnp.where(s > 0, s, 1), 0).astype(inputs.dtype)
