"""The emulated GEMMs of the MXFP8 and NVFP4 recipes (mxfp8_dense.py, nvfp4_dense.py): when
they may run, the error when they may not, and their count and log.

Such a GEMM runs natively on CUDA GPUs of compute capability 10.0+ (qmesh's C++ GEMM through
its FFI handler, microscaled_gemm.py). Elsewhere it runs emulated (dequantized, then a GEMM with
float32 accumulation: the C++ emulation on other GPUs, the Python one below on the CPU) only
when asked: the recipe's `emulate=True`, or QMESH_BLOCK_EMULATION=1. Otherwise the layer
raises, naming the device and what it lacks. Every emulated GEMM is counted in
qmesh.jax.stats()["emulated_gemms"] (at trace time); the first of each format is logged as a
warning.
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

from qmesh.jax import stats
from qmesh.jax.common import F32

_log = logging.getLogger("qmesh")
_logged: set = set()


def emulation_requested(recipe) -> bool:
    """recipe.emulate, or QMESH_BLOCK_EMULATION=1 (ValueError for values other than 0/1)."""
    env = os.environ.get("QMESH_BLOCK_EMULATION", "0") or "0"
    if env not in ("0", "1"):
        raise ValueError(f"QMESH_BLOCK_EMULATION must be 0 or 1, got {env!r}")
    return recipe.emulate or env == "1"


def runs_natively(device) -> bool:
    """Whether `device` has the native MXFP8 / NVFP4 GEMM: a CUDA GPU of compute capability
    10.0 or later."""
    if device.platform != "gpu":
        return False
    cc = str(getattr(device, "compute_capability", "0"))
    return int(cc.split(".")[0]) >= 10


def _missing(device, fmt: str) -> str:
    if device.platform == "cpu":
        return f"the CPU backend has no native {fmt} GEMM"
    cc = getattr(device, "compute_capability", "unknown")
    return (
        f"{fmt} GEMMs need compute capability 10.0 (Blackwell) to run natively; this is "
        f"{device.device_kind} ({cc})"
    )


def require_emulation(recipe, fmt: str) -> None:
    """Raises ValueError naming the device unless it runs the GEMM natively or emulation was
    requested; fmt: "MXFP8" or "NVFP4"."""
    device = jax.devices()[0]
    if not runs_natively(device) and not emulation_requested(recipe):
        raise ValueError(
            f"{_missing(device, fmt)}. Set {type(recipe).__name__}(emulate=True) or "
            "QMESH_BLOCK_EMULATION=1 to run them emulated (dequantized, then a GEMM with "
            "float32 accumulation)"
        )


def wide_dtype():
    """The dtype the Python emulation dequantizes operands to: float32 on the CPU, bfloat16 on
    GPUs (both hold MXFP8 values and NVFP4's code times block scale exactly)."""
    return F32 if jax.devices()[0].platform == "cpu" else jnp.bfloat16


def count(fmt: str) -> None:
    """Counts one emulated GEMM of `fmt` operands and logs the first of each format."""
    stats.count("emulated_gemms")
    if fmt not in _logged:
        _logged.add(fmt)
        _log.warning(
            "GEMMs with %s operands run EMULATED (operands dequantized, then a GEMM with "
            "float32 accumulation): the format's numerics, not its speed",
            fmt,
        )


class DenseConfig(NamedTuple):
    """The static part of one emulated dense call (a nondiff argument of its custom_vjp)."""

    recipe: object  # MXFP8BlockScaling or NVFP4BlockScaling
    activation: str | None
    out_dtype: object
    x_dtype: object
    kernel_dtype: object
    bias_dtype: object  # None without a bias


def dense_operands(x, kernel, bias, recipe, activation, out_dtype, block: int, fmt: str):
    """(x as [rows, K], kernel, bias, DenseConfig, y's shape) of an emulated dense layer
    act(x @ kernel + bias), checked: x [..., K], kernel [K, N], bias [N] or None; the tokens
    (rows), K and N multiples of `block` (one scale per `block` elements in both directions).
    out_dtype None: x's."""
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
    rows = x.size // x.shape[-1] if x.shape[-1] else 0
    k, n = kernel.shape
    if rows % block or k % block or n % block:
        raise ValueError(
            f"dense under {fmt} needs the tokens ({rows}), K ({k}) and N ({n}) to be multiples "
            f"of {block} (one scale per {block} elements in both directions)"
        )
    dtypes = (x.dtype, kernel.dtype, None if bias is None else bias.dtype)
    cfg = DenseConfig(recipe, activation, out_dtype, *dtypes)
    return x.reshape(rows, k), kernel, bias, cfg, (*x.shape[:-1], n)
