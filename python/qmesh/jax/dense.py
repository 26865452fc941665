"""The FP8 dense layer y = act(x @ kernel + bias) as one differentiable JAX function.

    state = init_state(recipe)                       # DelayedScaling only (None otherwise)
    y = dense(x, kernel, bias, state, recipe=recipe, activation="gelu")

Forward: x (E4M3) and kernel (E4M3) are quantized with the recipe's scales and multiplied by
qmesh's GEMM with their scale_inv operands; the bias and the GELU run in the GEMM's epilogue
for a bf16 or fp16 output (bias and saved pre-activation in that type, cuBLASLt's FP8 rule), and
in float32 right after the GEMM for a float32 output.
Backward: the output gradient is quantized to the recipe's backward dtype (E5M2 with HYBRID),
the bias gradient fused with that cast; dgrad = dy @ kernel^T and wgrad = x^T @ dy are FP8
GEMMs on the FP8 codes saved by the forward (no full-precision copies are kept). Every cast
writes its columnwise copy too, so that all three GEMMs read their FP8 operands contiguous
along K (the TN form): no FP8 data is transposed.

Delayed scaling state (a dict, Flax's names): input_/kernel_/output_grad_ amax_history
(float32 [amax_history_len]) and _scale (float32 scalars). The forward takes this step's scales
from the state by qmesh's delayed-scaling rule (docs/design/fp8_scaling.md); the backward records
this step's amaxes, and the new state comes back as the *gradient* of the state: Flax's
`_overwrite_with_gradient` collection (TrainState replaces the state by its gradient). Without
a backward pass the state does not change. How uses combine (vmap, sharing, microbatches) and
what happens to an unused layer: delayed_state.py.

Sharding: x's rows and the kernel's columns keep their shardings; the amaxes are reduced by
the quantize primitives over every mesh axis but the pipeline axis (XLA merges the step's
amax reductions into one all-reduce); the bias gradient is summed over the axes that shard the
rows; a GEMM whose contracting dimension is sharded sums its partial products (see gemm.py).
`row_axes` pins the rows (tokens) of the FP8 operands that carry them, x's codes in forward
and the output gradient's codes in backward, to exactly those mesh axes: under sequence
parallelism the activations arrive sequence-sharded and are all-gathered as FP8 codes (one
byte per value) right before the GEMMs, as TransformerEngine does.

FP8 needs K and N multiples of 16 on CUDA (cuBLASLt). When FP8 cannot be used the call raises
with the reason, unless `fallback="bf16"`: then the layer runs in bfloat16 (float32
accumulation), the state passes through unchanged, and qmesh.jax.stats() counts it.

Float8BlockScaling (docs/design/block_scaling.md): no state (like current scaling). Forward:
x in 1x128 blocks and the kernel in 128x128 tiles (the recipe's block dims and QParams), each
cast writing its columnwise copy; backward: the output gradient in 1x128 blocks with its bias
gradient fused into the cast (block_dbias_quantize); the three GEMMs are block-scaled GEMMs in
the TN form. No amax is reduced across devices: the only collectives are the sums of partial
products over a sharded K and of the parameter gradients. Under row_axes the token operands
are gathered with both copies (a transposed copy of block codes would have the wrong blocks).
A sharded dimension must split into shards that keep whole blocks (block_quantize.py). Under
collective_gemm the token operands that arrive sequence-sharded are cast rowwise per shard
(the rings gather those codes) and columnwise from their all-gathered high-precision rows
(block_cast's seq_rows).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from qmesh.jax import collective_gemm as _cgemm
from qmesh.jax import delayed_state, mxfp8_dense, nvfp4_dense, sharding, stats
from qmesh.jax.autocast import recipe_in_force
from qmesh.jax.block_quantize import block_dbias_quantize, block_quantize
from qmesh.jax.common import F32, FP8_DTYPES, WIDE_DTYPES, entry
from qmesh.jax.gemm import Epilogue, dgelu, gelu, gemm
from qmesh.jax.quantize import dbias_quantize, quantize, quantize_current
from qmesh.jax.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    check_recipe,
)

OPERANDS = delayed_state.OPERANDS
ACTIVATIONS = (None, "gelu")
FALLBACKS = (None, "bf16")


def init_state(recipe) -> dict | None:
    """The delayed-scaling state of one dense layer (scales 1, histories 0); None for a
    recipe without state."""
    check_recipe(recipe)
    if not isinstance(recipe, DelayedScaling):
        return None
    state = {}
    for name in OPERANDS:
        state[f"{name}_amax_history"] = jnp.zeros((recipe.amax_history_len,), F32)
        state[f"{name}_scale"] = jnp.ones((), F32)
    return state


def backend_platform() -> str:
    """The platform the layer is compiled for (the default backend's)."""
    return jax.default_backend()


def fp8_unsupported_reason(x_dtype, k: int, n: int, platform: str | None = None) -> str | None:
    """Why the FP8 path cannot take this layer (None when it can)."""
    if jnp.dtype(x_dtype) not in WIDE_DTYPES:
        return f"dense: x must be float32, bfloat16 or float16 for FP8, not {jnp.dtype(x_dtype)}"
    platform = backend_platform() if platform is None else platform
    if platform in ("cuda", "gpu") and (k % 16 or n % 16):
        return (
            f"dense: FP8 on CUDA needs the input features K and output features N to be "
            f"multiples of 16 (cuBLASLt), got K={k}, N={n}"
        )
    return None


@dataclasses.dataclass(frozen=True)
class Config:
    """The static part of one dense call (a nondiff argument of its custom_vjp)."""

    recipe: DelayedScaling | Float8CurrentScaling | Float8BlockScaling
    activation: str | None
    has_bias: bool
    out_dtype: object
    row_axes: tuple | None = None
    collective_gemm: _cgemm.CollectiveGemm | None = None  # the SP GEMMs through qmesh's rings
    # delayed_state's reporting, read when the layer is called (a static part of the trace).
    report: bool = dataclasses.field(default_factory=delayed_state.reporting)


def check_state(state, recipe):
    """Raises ValueError unless `state` fits `recipe` (init_state(recipe)'s keys and shapes)."""
    if not isinstance(recipe, DelayedScaling):
        if state is not None:
            raise ValueError(f"dense: {type(recipe).__name__} keeps no state; pass state=None")
        return
    if not isinstance(state, dict):
        raise ValueError(
            "dense: DelayedScaling needs the state of init_state(recipe) (a dict "
            f"of input_/kernel_/output_grad_ amax_history and scale), not "
            f"{type(state).__name__}"
        )
    wanted = [f"{o}_{s}" for o in OPERANDS for s in ("amax_history", "scale")]
    missing, extra = [k for k in wanted if k not in state], sorted(set(state) - set(wanted))
    if missing or extra:
        raise ValueError(
            f"dense: the state lacks {missing} and has unknown keys {extra}; "
            "start from init_state(recipe)"
        )
    for o in OPERANDS:
        h, s = jnp.shape(state[f"{o}_amax_history"]), jnp.shape(state[f"{o}_scale"])
        if h != (recipe.amax_history_len,) or s not in ((), (1,)):
            raise ValueError(
                f"dense: state {o}_amax_history must be [{recipe.amax_history_len}] "
                f"and {o}_scale a scalar, not {list(h)} and {list(s)}"
            )
    delayed_state.check_state(state, "dense")


def _pin_rows(q, row_axes):
    """q with its codes' rows ([M, ...]) constrained to the mesh axes `row_axes` (None: as
    they come)."""
    if row_axes is None:
        return q
    return q._replace(q=sharding.constrain(q.q, (entry(row_axes), PartitionSpec.UNCONSTRAINED)))


class BlockQuantized(NamedTuple):
    """A block-scaled tensor: codes and scales, and the columnwise copy with its scales."""

    q: jax.Array
    scale_inv: jax.Array
    q_t: jax.Array
    scale_inv_t: jax.Array


# The block dims and QParams of each operand role under Float8BlockScaling.
_BLOCK_ROLES = {
    "x": ("x_block_scaling_dim", "fp8_quant_fwd_inp"),
    "kernel": ("w_block_scaling_dim", "fp8_quant_fwd_weight"),
    "grad": ("grad_block_scaling_dim", "fp8_quant_bwd_grad"),
}


def block_cast(x, dtype, recipe, role, with_dbias=False, seq_rows=False):
    """x [rows, cols] block-quantized as `role` with its columnwise copy (and, with_dbias,
    its column sums from the same pass: (BlockQuantized, dbias)). seq_rows: x's rows
    arrive sequence-sharded at a collective GEMM (see sequence_rows()): the rowwise codes are
    cast per shard (the ring gathers them), the columnwise copy from x's rows all-gathered in
    high precision (its blocks run along the rows, across the shards): the rowwise cast of
    the gathered x.T, whose 1x128 blocks are the columnwise copy's 128x1 blocks."""
    dim, qparams = (getattr(recipe, name) for name in _BLOCK_ROLES[role])
    cast = block_dbias_quantize if with_dbias else block_quantize
    scaling = dict(
        block=dim, power_2_scale=qparams.power_2_scale, amax_epsilon=qparams.amax_epsilon
    )
    if seq_rows:
        # The ring that reads the rowwise codes starts after the all-gather on every device
        # (a blocking collective each: in no fixed order, two devices could each wait in
        # one for the other, when XLA's threads run out).
        whole, x = lax.optimization_barrier((_cgemm.gather_rows(x), x))
    outs = cast(x, dtype, columnwise=not seq_rows, **scaling)
    if seq_rows:
        outs = (*outs[:2], *block_quantize(whole.T, dtype, **scaling)[:2], *outs[4:])
    return (BlockQuantized(*outs[:4]), outs[4]) if with_dbias else BlockQuantized(*outs)


def sequence_rows(cfg, role) -> bool:
    """Whether the token rows of operand `role` ("x" or "grad") arrive sequence-sharded at a
    collective GEMM: x of a column-parallel layer, the output gradient of a row-parallel one
    (the others have every token of their batch shard)."""
    ring = cfg.collective_gemm
    return ring is not None and ring.parallel == ("column" if role == "x" else "row")


def block_blocks(recipe, a_role, b_role) -> dict:
    """The GEMM's a_block / b_block keywords for operands of these roles (empty unless the
    recipe is Float8BlockScaling)."""
    if not isinstance(recipe, Float8BlockScaling):
        return {}
    return dict(
        a_block=getattr(recipe, _BLOCK_ROLES[a_role][0]),
        b_block=getattr(recipe, _BLOCK_ROLES[b_role][0]),
    )


def copy_of(q, columnwise: bool):
    """(codes, scale_inv) of the rowwise or the columnwise copy of a quantized tensor."""
    if isinstance(q, BlockQuantized):
        return (q.q_t, q.scale_inv_t) if columnwise else (q.q, q.scale_inv)
    return (q.q_t if columnwise else q.q), q.scale_inv


def amax_of(q):
    """The amax a cast measured (0 for a block-scaled cast, which keeps none)."""
    return jnp.zeros((), F32) if isinstance(q, BlockQuantized) else q.amax


def _quantize(x, scale, dtype, recipe, columnwise=True, role="x", seq_rows=False):
    """x [rows, cols] quantized with `scale` (delayed scaling), its own amax (current
    scaling) or its blocks' amaxes (block scaling, as operand `role`: "x", "kernel" or
    "grad"; seq_rows: as block_cast's); with `columnwise`, also the codes of x.T
    from the same fused pass (always under block scaling)."""
    if isinstance(recipe, Float8BlockScaling):
        return block_cast(x, dtype, recipe, role, seq_rows=seq_rows)
    if isinstance(recipe, DelayedScaling):
        return quantize(x, scale, dtype, columnwise=columnwise)
    return quantize_current(
        x,
        dtype,
        columnwise=columnwise,
        power_of_two_scales=recipe.power_of_two_scales,
        amax_epsilon=recipe.amax_epsilon,
    )


def tokens_columnwise(cfg) -> bool:
    """Whether the operands with a token dimension (x, the output gradient) get columnwise
    copies for the weight gradient. Every GEMM reads its FP8 operands contiguous along K (the
    TN form CUDA's FP8 GEMM takes), from the fused casts' columnwise copies, so no FP8 data is
    transposed; except where row_axes gathers their tokens (sequence parallelism): there the
    gathered codes are transposed locally for the weight gradient, which costs less than
    gathering a second copy. Block-scaled codes always get their columnwise copy (the blocks of
    a transpose differ). Likewise under collective_gemm (the rings gather the rowwise codes)."""
    tokens_whole = cfg.row_axes is None and cfg.collective_gemm is None
    return tokens_whole or isinstance(cfg.recipe, Float8BlockScaling)


# FP8 residuals are kept as their uint8 bit patterns under this checkpoint name: jax.checkpoint
# passes float residuals through reduce_precision(exponent_bits, mantissa_bits), which on
# float8_e4m3fn flushes subnormals and turns codes >= 256 into NaN (IEEE-style E4M3 has no
# such values); integers pass untouched. checkpoint_policies saves this name.
SAVED_NAME = "qmesh_fp8_operand"


class _Kept(NamedTuple):
    """One FP8 copy of an operand that the backward reads, with its scalars."""

    bits: jax.Array  # the FP8 codes as uint8
    amax: jax.Array
    scale_inv: jax.Array


def _kept(q, columnwise) -> _Kept:
    """One of q's two copies with q's amax and the copy's scale_inv, named for remat (the
    codes as their bits)."""
    codes, scale_inv = copy_of(q, columnwise)
    return _Kept(
        *checkpoint_name(
            (lax.bitcast_convert_type(codes, jnp.uint8), amax_of(q), scale_inv), SAVED_NAME
        )
    )


def step_of(state, recipe):
    """(history, scales [3], replaced) of this step (delayed_state.step_scales), or None
    without state."""
    return None if state is None else delayed_state.step_scales(state, recipe)


def _forward(cfg, x, kernel, bias, step, xq=None):
    """The forward pass with this step's step_of(...) `step` (None for current scaling);
    xq: x already quantized as [M, K] with its columnwise copy (the fused LayerNorm's codes)."""
    recipe = cfg.recipe
    lead, k = x.shape[:-1], x.shape[-1]
    fwd = recipe.fp8_format.fwd_dtype
    scales = (None,) * 3 if step is None else step[1]
    columnwise = tokens_columnwise(cfg)
    if xq is None:
        seq_rows = sequence_rows(cfg, "x")
        xq = _quantize(x.reshape(-1, k), scales[0], fwd, recipe, columnwise, seq_rows=seq_rows)
    xq = _pin_rows(xq, cfg.row_axes)
    wq = _quantize(kernel, scales[1], fwd, recipe, role="kernel")
    a, a_scale_inv = copy_of(xq, False)
    b, b_scale_inv = copy_of(wq, True)
    blocks = block_blocks(recipe, "x", "kernel")
    # The TN form (see tokens_columnwise): x's codes [M, K] and the kernel's columnwise copy
    # [N, K]; the backward keeps x's columnwise copy [K, M] (or its gathered codes) for wgrad
    # and the kernel's codes [K, N] for dgrad.
    gelu_on = cfg.activation == "gelu"
    # cuBLASLt fuses the bias and the GELU into an FP8 GEMM only with a bf16 or fp16 D, the bias
    # (and the GELU's aux) in D's type; with a float32 D they run after the GEMM, in float32
    # (XLA fuses them into one elementwise pass). The host GEMM follows the same rule, so both
    # platforms compute the same function.
    # The rings write float32 and take no epilogue: bias and GELU follow in float32. A
    # block-scaled GEMM takes the bias or the GELU but not both with the aux (cuBLASLt 13 on
    # Hopper refuses it, docs/design/gemm.md), so bias and GELU then follow in float32 too.
    fused = cfg.has_bias and cfg.out_dtype in (jnp.bfloat16, jnp.float16)
    fused = fused and not (gelu_on and blocks)
    if fused and cfg.collective_gemm is None:
        out = gemm(
            a,
            b,
            a_scale_inv,
            b_scale_inv,
            epilogue=Epilogue.BIAS_GELU_AUX if gelu_on else Epilogue.BIAS,
            bias=bias.astype(cfg.out_dtype),
            out_dtype=cfg.out_dtype,
            **blocks,
        )
        out, aux = out if gelu_on else (out, None)
    else:
        wide = cfg.has_bias or gelu_on
        if cfg.collective_gemm is None:
            out = gemm(
                a,
                b,
                a_scale_inv,
                b_scale_inv,
                out_dtype=F32 if wide else cfg.out_dtype,
                **blocks,
            )
        else:
            out, kept = _cgemm.forward(
                cfg.collective_gemm, a, a_scale_inv, b, b_scale_inv, **blocks
            )
            out, xq = out.astype(F32 if wide else cfg.out_dtype), xq._replace(q=kept)
        if cfg.has_bias:
            out = out + bias.astype(F32)
        aux = out if gelu_on else None  # the float32 pre-activation
        if gelu_on:
            out = gelu(out)
        out = out.astype(cfg.out_dtype)
    y = out.reshape(*lead, out.shape[-1])
    return y, (_kept(xq, columnwise), _kept(wq, False), aux, lead)


class Residuals(NamedTuple):
    """What the forward keeps for the backward. The FP8 codes are kept as their uint8 bit
    patterns (see SAVED_NAME); the *_like arrays are empty, of the dtypes of x, kernel and
    bias (None without bias): the dtypes of the gradients."""

    x_bits: jax.Array  # x's columnwise codes [K, M] (its codes [M, K] if row_axes is set)
    x_scale_inv: jax.Array  # (block scaling: the scale tensors of the kept copies)
    x_amax: jax.Array
    kernel_bits: jax.Array  # the kernel's codes [K, N]
    kernel_scale_inv: jax.Array
    kernel_amax: jax.Array
    aux: jax.Array | None  # the pre-activation [M, N] with GELU, else None
    state: dict | None
    step: tuple | None  # step_of(state, recipe)
    x_like: jax.Array
    kernel_like: jax.Array
    bias_like: jax.Array | None


def forward(cfg, x, kernel, bias, state, xq=None, step=None):
    """(y, Residuals): the forward pass with the residuals its backward needs. xq: x already
    quantized as [M, K] (the fused LayerNorm's codes); step: this step's step_of(...) when
    the caller already took it."""
    if step is None:
        step = step_of(state, cfg.recipe)
    y, (xq, wq, aux, lead) = _forward(cfg, x, kernel, bias, step, xq)
    res = Residuals(
        xq.bits,
        xq.scale_inv,
        xq.amax,
        wq.bits,
        wq.scale_inv,
        wq.amax,
        aux,
        state,
        step,
        jnp.zeros((0,), x.dtype),
        jnp.zeros((0,), kernel.dtype),
        None if bias is None else jnp.zeros((0,), bias.dtype),
    )
    return y, res


def backward(cfg, res: Residuals, g):
    """(dx, dkernel, dbias, new_state) for the output gradient g [..., N] (dbias None
    without bias, new_state None without state)."""
    recipe = cfg.recipe
    g2 = g.reshape(-1, g.shape[-1])
    if res.aux is not None:
        g2 = (g2.astype(F32) * dgelu(res.aux.astype(F32))).astype(g.dtype)
    bwd, scale = recipe.fp8_format.bwd_dtype, grad_scale(res)
    columnwise = tokens_columnwise(cfg)
    dbias = None
    if isinstance(recipe, Float8BlockScaling):
        seq_rows = sequence_rows(cfg, "grad")
        if cfg.has_bias:
            gq, dbias = block_cast(g2, bwd, recipe, "grad", True, seq_rows)
        else:
            gq = block_cast(g2, bwd, recipe, "grad", seq_rows=seq_rows)
    elif isinstance(recipe, DelayedScaling):
        if cfg.has_bias:
            gq, dbias = dbias_quantize(g2, scale, bwd, columnwise=columnwise)
        else:
            gq = quantize(g2, scale, bwd, columnwise=columnwise)
    else:
        gq = _quantize(g2, None, bwd, recipe, columnwise, role="grad")
        if cfg.has_bias:
            dbias = jnp.sum(g2.astype(F32), axis=0)
    dx, dw, db, new_state = backward_quantized(cfg, res, gq, dbias)
    return dx.reshape(*g.shape[:-1], dx.shape[-1]), dw, db, new_state


def grad_scale(res: Residuals):
    """This step's scale of the output gradient's cast (delayed scaling), else None."""
    return None if res.step is None else res.step[1][2]


def backward_quantized(cfg, res: Residuals, gq, dbias):
    """(dx [M, K], dkernel, dbias, new_state) from the output gradient already cast: gq its
    Quantized codes [M, N] (with grad_scale(res) under delayed scaling, and the columnwise
    copy when tokens_columnwise(cfg)), dbias its column sums (None without bias)."""
    recipe = cfg.recipe
    fwd = recipe.fp8_format.fwd_dtype
    x_kept, w_q = (lax.bitcast_convert_type(b, fwd) for b in (res.x_bits, res.kernel_bits))
    gq = _pin_rows(gq, cfg.row_axes)
    if cfg.collective_gemm is not None:
        # The cast's reductions over the mesh (its amax, the bias gradient) finish before the
        # ring starts, on every device (see block_cast).
        gq, dbias = lax.optimization_barrier((gq, dbias))
    # TN form: dgrad reads g's codes [M, N] and the kernel's codes [K, N]; wgrad x's and g's
    # columnwise copies [K, M] and [N, M] (the gathered codes transposed, see
    # tokens_columnwise).
    columnwise = tokens_columnwise(cfg)
    g, g_scale_inv = copy_of(gq, False)
    g_t, g_t_scale_inv = copy_of(gq, columnwise)
    if cfg.collective_gemm is None:
        dx = gemm(
            g,
            w_q,
            g_scale_inv,
            res.kernel_scale_inv,
            out_dtype=res.x_like.dtype,
            split_accumulator=True,
            **block_blocks(recipe, "grad", "kernel"),
        )
    else:  # g_rows: g's codes with the rows of x_kept (gathered by the ring for row parallel)
        dx, g_rows = _cgemm.dgrad(
            cfg.collective_gemm,
            g,
            g_scale_inv,
            w_q,
            res.kernel_scale_inv,
            **block_blocks(recipe, "grad", "kernel"),
        )
        dx = dx.astype(res.x_like.dtype)
        if not columnwise:  # per-tensor: wgrad transposes the codes (block: its own copy)
            g_t = g_rows
    x_t, g_t = (x_kept, g_t) if columnwise else (x_kept.T, g_t.T)
    dw = gemm(
        x_t,
        g_t,
        res.x_scale_inv,
        g_t_scale_inv,
        out_dtype=res.kernel_like.dtype,
        split_accumulator=True,
        **block_blocks(recipe, "x", "grad"),
    )
    db = None if res.bias_like is None else dbias.astype(res.bias_like.dtype)
    new_state = None
    if isinstance(recipe, DelayedScaling):
        new_state = delayed_state.recorded_state(
            *res.step, (res.x_amax, res.kernel_amax, gq.amax), res.state, report=cfg.report
        )
    return dx, dw, db, new_state


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense(cfg, x, kernel, bias, state):
    return _forward(cfg, x, kernel, bias, step_of(state, cfg.recipe))[0]


_dense.defvjp(forward, backward)


@jax.custom_vjp
def _pass_state(y, state):
    """y, whose backward gives `state` back unchanged as the state's "gradient" (the fallback
    keeps the FP8 state as it is)."""
    return y


_pass_state.defvjp(lambda y, state: (y, state), lambda state, g: (g, state))


def _require_wide(dtype, what: str) -> None:
    """TypeError naming `what` unless dtype is a floating dtype wider than FP8."""
    if not jnp.issubdtype(dtype, jnp.floating) or dtype in FP8_DTYPES:
        raise TypeError(
            f"dense: {what} must be a floating dtype wider than FP8 (float32, "
            f"bfloat16, float16; others run with fallback='bf16'), not {dtype}"
        )


def unquantized(x, kernel, bias, activation, out_dtype, dtype=jnp.bfloat16):
    """act(x @ kernel + bias) without FP8: operands in `dtype`, float32 accumulation."""
    y = jnp.matmul(x.astype(dtype), kernel.astype(dtype), preferred_element_type=F32)
    if bias is not None:
        y = y + bias.astype(F32)
    if activation == "gelu":
        y = gelu(y)
    return y.astype(out_dtype)


def dense(
    x,
    kernel,
    bias=None,
    state=None,
    *,
    recipe=None,
    activation: str | None = None,
    out_dtype=None,
    fallback: str | None = None,
    row_axes: tuple | None = None,
    collective_gemm: _cgemm.CollectiveGemm | str | bool | None = None,
    sr_key=None,
):
    """act(x @ kernel + bias) with FP8 GEMMs in forward and backward.

    x: [..., K] (float32, bfloat16 or float16); kernel: [K, N]; bias: [N] or None; state: the
    delayed-scaling state (init_state(recipe)) or None for Float8CurrentScaling and
    Float8BlockScaling; recipe: DelayedScaling(), Float8CurrentScaling() or
    Float8BlockScaling() (or MXFP8BlockScaling() / NVFP4BlockScaling(): GEMMs emulated, see
    mxfp8_dense.py / nvfp4_dense.py; no state; fallback and row_axes have no effect); None:
    the autocast's (high precision under autocast(enabled=False)), DelayedScaling() outside
    autocast; activation: None or "gelu" (tanh
    approximation); out_dtype: default x's dtype; fallback: None (raise when FP8 cannot be
    used) or "bf16" (run in bfloat16 then, counted in qmesh.jax.stats()); row_axes: None, or
    the mesh axes (a tuple, () for replicated) the rows of x's and the output gradient's FP8
    codes are constrained to before their GEMMs, under the mesh of the context (no effect
    without one); collective_gemm: a CollectiveGemm or an overlap name ("none", "ring",
    "bidir": column parallel): under sequence parallelism the GEMMs run through qmesh's
    all-gather/reduce-scatter rings (collective_gemm.py; row_axes is then not used); False:
    XLA's collectives; None: the autocast's (autocast(collective_gemm=...), column parallel: a
    row-parallel dense passes CollectiveGemm(overlap, "row")), else XLA's collectives; sr_key:
    NVFP4BlockScaling's jax.random key for the stochastic rounding of the output gradient
    (needed unless the recipe disables it; a new key each step; other recipes do not use it).

    Returns y [..., N]. Differentiate with respect to `state` to get the updated state."""
    recipe = recipe_in_force(recipe, DelayedScaling())
    explicit = collective_gemm is not None  # else the autocast's, skipped by a fallback
    collective_gemm = _cgemm.of(_cgemm.in_force(collective_gemm, recipe), "column")
    if activation not in ACTIVATIONS:
        raise ValueError(f"dense: activation must be one of {ACTIVATIONS}, not {activation!r}")
    if fallback not in FALLBACKS:
        raise ValueError(f"dense: fallback must be None or 'bf16', not {fallback!r}")
    if out_dtype is not None:
        _require_wide(jnp.dtype(out_dtype), "out_dtype")
    if isinstance(recipe, (MXFP8BlockScaling, NVFP4BlockScaling)):
        if state is not None:
            raise ValueError(f"dense: {type(recipe).__name__} keeps no state; pass state=None")
        _cgemm.check_recipe(collective_gemm, recipe)
        if isinstance(recipe, NVFP4BlockScaling):
            return nvfp4_dense.dense(x, kernel, bias, recipe, activation, out_dtype, sr_key)
        return mxfp8_dense.dense(x, kernel, bias, recipe, activation, out_dtype)
    if recipe is not None:
        check_recipe(recipe)
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    if x.ndim < 1 or kernel.ndim != 2 or x.shape[-1] != kernel.shape[0]:
        raise ValueError(
            f"dense: x must be [..., K] and kernel [K, N] with the same K, got x "
            f"{tuple(x.shape)} and kernel {tuple(kernel.shape)}"
        )
    if bias is not None:
        bias = jnp.asarray(bias)
        if bias.shape != (kernel.shape[1],):
            raise ValueError(
                f"dense: bias must be [N] = [{kernel.shape[1]}], not {list(bias.shape)}"
            )
    out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
    for dtype, what in ((x.dtype, "x"), (kernel.dtype, "kernel"), (out_dtype, "out_dtype")):
        _require_wide(dtype, what)
    if recipe is None:  # high precision (autocast(enabled=False))
        _cgemm.check_quantized(collective_gemm, recipe)
        y = unquantized(x, kernel, bias, activation, out_dtype, x.dtype)
        return y if state is None else _pass_state(y, state)
    check_state(state, recipe)
    reason = fp8_unsupported_reason(x.dtype, kernel.shape[0], kernel.shape[1])
    if reason is None and kernel.dtype not in WIDE_DTYPES:
        reason = f"dense: kernel must be float32, bfloat16 or float16 for FP8, not {kernel.dtype}"
    _cgemm.check_recipe(collective_gemm, recipe)
    if reason is not None and collective_gemm is not None and explicit:
        raise ValueError(f"{reason}; collective_gemm needs the FP8 GEMMs")
    if reason is not None:
        if fallback is None:
            raise ValueError(f"{reason}; pass fallback='bf16' to run such layers in bfloat16")
        stats.count_fallback(reason)
        y = unquantized(x, kernel, bias, activation, out_dtype)
        return y if state is None else _pass_state(y, state)
    row_axes = None if row_axes is None or collective_gemm is not None else tuple(row_axes)
    cfg = Config(recipe, activation, bias is not None, out_dtype, row_axes, collective_gemm)
    return _dense(cfg, x, kernel, bias, state)
