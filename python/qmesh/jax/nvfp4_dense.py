"""The dense layer y = act(x @ kernel + bias) under NVFP4BlockScaling (docs/design/nvfp4.md,
"The recipe in JAX"): qmesh.jax.dense.dense calls it for that recipe.

Forward: x is quantized in 1x16 blocks (round to nearest even) with its columnwise copy (x^T,
the random Hadamard transform applied unless disable_rht), the kernel in 16x16 tiles (1x16
blocks with disable_2d_quantization) with its columnwise copy. Backward: the output gradient
(times GELU's derivative) is quantized in 1x16 blocks, rounded stochastically (unless
disable_stochastic_rounding) with the layer's key, with its columnwise copy (transformed as
x's, with the same sign mask RHT_SIGNS: the wgrad GEMM contracts the tokens, and the
orthogonal transform of both operands cancels). fprop = x @ kernel, dgrad = dy @ kernel^T
and wgrad = x^T @ dy each read the copies whose rows run along their K.

The GEMMs run natively on compute capability 10.0+ and emulated elsewhere only when asked,
counted and logged (microscaled_gemm.py, emulation.py). The Python emulation (the CPU's)
dequantizes each operand's codes times block scales (float32 on the CPU; exact), multiplies
with float32 accumulation and applies the two per-tensor scales to the product, as the native
GEMM's alpha would. The bias gradient is the float32 column sum of the
(unquantized) output gradient.

The key (a jax.random key, or uint32 [2] key data) rides the custom_vjp to the backward's
gradient cast: the same key gives the same bits (docs/design/nvfp4.md "Rounding"). Sharding:
the casts (stochastic rounding and the RHT included: each shard at its place in the whole
tensor, with its amaxes; nvfp4.py) and the GEMMs (microscaled_gemm.py) are partitioned.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from qmesh.jax import emulation, microscaled_gemm
from qmesh.jax.common import F32
from qmesh.jax.gemm import dgelu, gelu
from qmesh.jax.nvfp4 import BLOCK, nvfp4_dequantize, nvfp4_quantize
from qmesh.jax.recipe import uses_sr

# The 16-bit sign mask of the random Hadamard transform (docs/design/nvfp4.md): fixed, drawn
# once; both operands of a wgrad GEMM must share it.
RHT_SIGNS = 0xB4E1


def cast(x, recipe, role: str, key=None):
    """Both copies of x [R, C] under the recipe's rule for `role` ("x", "kernel" or "grad"):
    (rowwise copy, columnwise copy of x^T), each (data, scale, scale_inv)."""
    if role == "kernel":
        q = nvfp4_quantize(x, columnwise=True, tiles_2d=not recipe.disable_2d_quantization)
    else:
        sr = role == "grad" and uses_sr(recipe)
        q = nvfp4_quantize(
            x,
            key if sr else None,
            columnwise=True,
            stochastic_rounding=sr,
            rht=not recipe.disable_rht,
            rht_signs=RHT_SIGNS,
        )
    return q[:3], q[3:]


def emulated_gemm(a, b):
    """The Python emulation: A [M, K] @ B [N, K]^T for NVFP4 copies (data, scale, scale_inv)
    along K, dequantized, in float32."""
    one = jnp.ones((1,), F32)
    wide = emulation.wide_dtype()
    a_v = nvfp4_dequantize(a[0], a[1], one, out_dtype=wide)
    b_v = nvfp4_dequantize(b[0], b[1], one, out_dtype=wide)
    return jnp.dot(a_v, b_v.T, preferred_element_type=F32) * (a[2][0] * b[2][0])


def _gemm(cfg, a, b):
    return microscaled_gemm.gemm("NVFP4", cfg.recipe, a, b, emulated_gemm)


def _forward(cfg, x, kernel, bias, key):
    x_row, x_col = cast(x, cfg.recipe, "x")
    w_row, w_col = cast(kernel, cfg.recipe, "kernel")
    pre = _gemm(cfg, x_row, w_col)  # x [M, K] . (kernel^T [N, K])^T
    if bias is not None:
        pre = pre + bias.astype(F32)
    gelu_on = cfg.activation == "gelu"
    y = gelu(pre) if gelu_on else pre
    # Kept: x^T's copy [K, M] for wgrad, the kernel's rowwise [K, N] for dgrad, the key.
    return y.astype(cfg.out_dtype), (x_col, w_row, pre if gelu_on else None, key)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense(cfg, x, kernel, bias, key):
    return _forward(cfg, x, kernel, bias, key)[0]


def _backward(cfg, saved, g):
    x_col, w_row, pre, key = saved
    g = g.astype(F32)
    if cfg.activation == "gelu":
        g = g * dgelu(pre)
    g_row, g_col = cast(g, cfg.recipe, "grad", key)
    dx = _gemm(cfg, g_row, w_row)  # dy [M, N] . (kernel [K, N])^T
    dw = _gemm(cfg, x_col, g_col)  # x^T [K, M] . (dy^T [N, M])^T
    db = None if cfg.bias_dtype is None else jnp.sum(g, axis=0).astype(cfg.bias_dtype)
    return dx.astype(cfg.x_dtype), dw.astype(cfg.kernel_dtype), db, None


_dense.defvjp(_forward, _backward)


def key_data(sr_key):
    """The uint32 key data of a jax.random key (typed, or raw uint32 [2] key data)."""
    if jnp.issubdtype(jnp.asarray(sr_key).dtype, jax.dtypes.prng_key):
        return jax.random.key_data(sr_key)
    return jnp.asarray(sr_key)


def split_key(sr_key, n: int) -> tuple:
    """n distinct keys derived from sr_key (n Nones for None): one per layer or batch element."""
    if sr_key is None:
        return (None,) * n
    return tuple(jax.random.split(key_data(sr_key), n))


def dense(x, kernel, bias, recipe, activation, out_dtype, sr_key):
    """act(x @ kernel + bias) for x [..., K], kernel [K, N], bias [N] or None (K, N and the
    tokens multiples of 16), in out_dtype (default x's dtype); sr_key: the jax.random key of
    the output gradient's stochastic rounding (needed unless the recipe disables it; a new
    key each step). See the module docstring."""
    emulation.require_emulation(recipe, "NVFP4")
    x2, kernel, bias, cfg, shape = emulation.dense_operands(
        x, kernel, bias, recipe, activation, out_dtype, BLOCK, "NVFP4"
    )
    if uses_sr(recipe) and sr_key is None:
        raise ValueError(
            "dense: NVFP4BlockScaling rounds the gradients stochastically and needs a key: pass "
            "sr_key=jax.random.key(...) (a new one each step; in Flax modules and drop-ins, "
            "rngs={'sr_rng': key}; in a function of wrap_function_in_state_module, "
            "sr_key=states.sr_key()), or NVFP4BlockScaling(disable_stochastic_rounding=True)"
        )
    key = key_data(sr_key) if uses_sr(recipe) else None
    return _dense(cfg, x2, kernel, bias, key).reshape(shape)
