"""The dense layer y = act(x @ kernel + bias) under MXFP8BlockScaling (docs/design/mxfp8.md),
with its three GEMMs EMULATED: qmesh.jax.dense.dense calls it for that recipe.

Forward: x and the kernel are MXFP8-quantized (the recipe's forward dtype, both copies); the
GEMM reads each operand from its copy whose rows run along K, dequantizes it (float32 on the
CPU, bfloat16 on GPUs, both exact) and multiplies with float32 accumulation; bias and GELU
follow in float32. Backward: the output gradient (times GELU's derivative) is quantized to the
backward dtype with its bias gradient fused; dgrad = dy @ kernel^T and wgrad = x^T @ dy are
emulated the same way from the codes the forward kept.

No device qmesh drives has a native MXFP8 GEMM yet (it needs compute capability 10.0), so the
emulation runs only when asked: MXFP8BlockScaling(emulate=True), or QMESH_BLOCK_EMULATION=1.
Otherwise the call raises, naming the device. Every emulated GEMM is counted in
qmesh.jax.stats()["emulated_gemms"] (at trace time) and the first is logged as a warning.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

from qmesh.jax import stats
from qmesh.jax.common import F32
from qmesh.jax.gemm import dgelu, gelu
from qmesh.jax.mxfp8 import MX_BLOCK, mxfp8_dbias_quantize, mxfp8_dequantize, mxfp8_quantize

_log = logging.getLogger("qmesh")
_logged = False


def emulation_requested(recipe) -> bool:
    """recipe.emulate, or QMESH_BLOCK_EMULATION=1 (ValueError for values other than 0/1)."""
    env = os.environ.get("QMESH_BLOCK_EMULATION", "0") or "0"
    if env not in ("0", "1"):
        raise ValueError(f"QMESH_BLOCK_EMULATION must be 0 or 1, got {env!r}")
    return recipe.emulate or env == "1"


def _missing(device) -> str:
    if device.platform == "cpu":
        return "the CPU backend has no native MXFP8 GEMM"
    cc = getattr(device, "compute_capability", "unknown")
    return (
        f"MXFP8 GEMMs need compute capability 10.0 (Blackwell); this is {device.device_kind} "
        f"({cc}), and qmesh does not drive the native MXFP8 GEMM on any device yet"
    )


def require_emulation(recipe) -> None:
    """Raises ValueError naming the device unless emulation was requested."""
    if not emulation_requested(recipe):
        raise ValueError(
            f"{_missing(jax.devices()[0])}. Set MXFP8BlockScaling(emulate=True) or "
            "QMESH_BLOCK_EMULATION=1 to run them emulated (dequantized, then a GEMM with "
            "float32 accumulation)"
        )


def emulated_gemm(a_q, a_s, b_q, b_s):
    """A [M, K] @ B [N, K]^T for MXFP8 rowwise copies along K, in float32."""
    global _logged
    wide = F32 if jax.devices()[0].platform == "cpu" else jnp.bfloat16
    stats.count("emulated_gemms")
    if not _logged:
        _logged = True
        _log.warning(
            "GEMMs with MXFP8 operands run EMULATED (operands dequantized to %s, then a GEMM "
            "with float32 accumulation): the format's numerics, not its speed",
            jnp.dtype(wide).name,
        )
    a = mxfp8_dequantize(a_q, a_s, out_dtype=wide)
    b = mxfp8_dequantize(b_q, b_s, out_dtype=wide)
    return jnp.dot(a, b.T, preferred_element_type=F32)


class _Config(NamedTuple):
    recipe: object  # MXFP8BlockScaling
    activation: str | None
    out_dtype: object
    x_dtype: object
    kernel_dtype: object
    bias_dtype: object  # None without a bias


def _forward(cfg, x, kernel, bias):
    recipe = cfg.recipe
    fwd = recipe.fp8_format.fwd_dtype
    xq = mxfp8_quantize(x, fwd, columnwise=True, margin=recipe.margin)
    wq = mxfp8_quantize(kernel, fwd, columnwise=True, margin=recipe.margin)
    pre = emulated_gemm(xq[0], xq[1], wq[2], wq[3])  # x [M, K] . (kernel^T [N, K])^T
    if bias is not None:
        pre = pre + bias.astype(F32)
    gelu_on = cfg.activation == "gelu"
    y = gelu(pre) if gelu_on else pre
    # Kept: x^T's copy [K, M] for wgrad, the kernel's rowwise [K, N] for dgrad.
    return y.astype(cfg.out_dtype), (xq[2], xq[3], wq[0], wq[1], pre if gelu_on else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense(cfg, x, kernel, bias):
    return _forward(cfg, x, kernel, bias)[0]


def _backward(cfg, saved, g):
    x_t, x_t_s, w, w_s, pre = saved
    g = g.astype(F32)
    if cfg.activation == "gelu":
        g = g * dgelu(pre)
    margin = cfg.recipe.margin
    gq = mxfp8_dbias_quantize(g, cfg.recipe.fp8_format.bwd_dtype, columnwise=True, margin=margin)
    dx = emulated_gemm(gq[0], gq[1], w, w_s)  # dy [M, N] . (kernel [K, N])^T
    dw = emulated_gemm(x_t, x_t_s, gq[2], gq[3])  # x^T [K, M] . (dy^T [N, M])^T
    db = None if cfg.bias_dtype is None else gq[4].astype(cfg.bias_dtype)
    return dx.astype(cfg.x_dtype), dw.astype(cfg.kernel_dtype), db


_dense.defvjp(_forward, _backward)


def dense(x, kernel, bias, recipe, activation, out_dtype):
    """act(x @ kernel + bias) for x [..., K], kernel [K, N], bias [N] or None (K, N and the
    tokens multiples of 32), in out_dtype (default x's dtype): see the module docstring."""
    x, kernel = jnp.asarray(x), jnp.asarray(kernel)
    bias = None if bias is None else jnp.asarray(bias)
    if x.ndim < 1 or kernel.ndim != 2 or x.shape[-1] != kernel.shape[0]:
        raise ValueError(
            f"dense: x must be [..., K] and kernel [K, N] with the same K, got x "
            f"{tuple(x.shape)} and kernel {tuple(kernel.shape)}"
        )
    if bias is not None and bias.shape != (kernel.shape[1],):
        raise ValueError(f"dense: bias must be [N] = [{kernel.shape[1]}], not {list(bias.shape)}")
    out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
    require_emulation(recipe)
    rows = x.size // x.shape[-1] if x.shape[-1] else 0
    k, n = kernel.shape
    if rows % MX_BLOCK or k % MX_BLOCK or n % MX_BLOCK:
        raise ValueError(
            f"dense under MXFP8 needs the tokens ({rows}), K ({k}) and N ({n}) to be multiples "
            f"of {MX_BLOCK} (one E8M0 scale per 32 elements in both directions)"
        )
    cfg = _Config(
        recipe,
        activation,
        out_dtype,
        x.dtype,
        kernel.dtype,
        None if bias is None else bias.dtype,
    )
    y = _dense(cfg, x.reshape(rows, k), kernel, bias)
    return y.reshape(*x.shape[:-1], n)
