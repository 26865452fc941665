"""The dense layer y = act(x @ kernel + bias) under MXFP8BlockScaling (docs/design/mxfp8.md):
qmesh.jax.dense.dense calls it for that recipe.

Forward: x and the kernel are MXFP8-quantized (the recipe's forward dtype, both copies); the
GEMM reads each operand from its copy whose rows run along K and accumulates in float32; bias
and GELU follow in float32. Backward: the output gradient (times GELU's derivative) is quantized
to the backward dtype with its bias gradient fused; dgrad = dy @ kernel^T and wgrad = x^T @ dy
read the codes the forward kept.

Where the GEMMs run (native on compute capability 10.0+, emulated elsewhere only when asked,
counted and logged): microscaled_gemm.py and emulation.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from qmesh.jax import emulation, microscaled_gemm
from qmesh.jax.common import F32
from qmesh.jax.gemm import dgelu, gelu
from qmesh.jax.mxfp8 import MX_BLOCK, mxfp8_dbias_quantize, mxfp8_dequantize, mxfp8_quantize


def emulated_gemm(a, b):
    """The Python emulation: A [M, K] @ B [N, K]^T for MXFP8 copies (codes, scales) along K,
    dequantized, in float32."""
    a_v = mxfp8_dequantize(*a, out_dtype=emulation.wide_dtype())
    b_v = mxfp8_dequantize(*b, out_dtype=emulation.wide_dtype())
    return jnp.dot(a_v, b_v.T, preferred_element_type=F32)


def _gemm(cfg, a, b):
    return microscaled_gemm.gemm("MXFP8", cfg.recipe, a, b, emulated_gemm)


def _forward(cfg, x, kernel, bias):
    recipe = cfg.recipe
    fwd = recipe.fp8_format.fwd_dtype
    xq = mxfp8_quantize(x, fwd, columnwise=True, margin=recipe.margin)
    wq = mxfp8_quantize(kernel, fwd, columnwise=True, margin=recipe.margin)
    pre = _gemm(cfg, xq[:2], wq[2:4])  # x [M, K] . (kernel^T [N, K])^T
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
    dx = _gemm(cfg, gq[:2], (w, w_s))  # dy [M, N] . (kernel [K, N])^T
    dw = _gemm(cfg, (x_t, x_t_s), gq[2:4])  # x^T [K, M] . (dy^T [N, M])^T
    db = None if cfg.bias_dtype is None else gq[4].astype(cfg.bias_dtype)
    return dx.astype(cfg.x_dtype), dw.astype(cfg.kernel_dtype), db


_dense.defvjp(_forward, _backward)


def dense(x, kernel, bias, recipe, activation, out_dtype):
    """act(x @ kernel + bias) for x [..., K], kernel [K, N], bias [N] or None (K, N and the
    tokens multiples of 32), in out_dtype (default x's dtype): see the module docstring."""
    emulation.require_emulation(recipe, "MXFP8")
    x2, kernel, bias, cfg, shape = emulation.dense_operands(
        x, kernel, bias, recipe, activation, out_dtype, MX_BLOCK, "MXFP8"
    )
    return _dense(cfg, x2, kernel, bias).reshape(shape)
