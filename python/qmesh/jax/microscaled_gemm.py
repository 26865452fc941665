"""The GEMMs of the MXFP8 and NVFP4 dense layers (mxfp8_dense.py, nvfp4_dense.py): where each
runs, one path per device.

  CUDA GPU   qmesh's C++ GEMM through the FFI handler qmesh_microscaled_gemm
             (src/ffi/microscaled_gemm_handler.cpp): the native cuBLASLt GEMM on compute
             capability 10.0+, the C++ emulation elsewhere (only when asked).
  CPU        the Python emulation (emulation.py): operands dequantized, then jnp.dot with
             float32 accumulation; it is the reference of the handler's numerics.

Every GEMM that runs emulated (the C++ emulation or the Python one) is counted in
qmesh.jax.stats()["emulated_gemms"] at trace time; a native GEMM is not.

Private switch: `_HANDLER_ON_CPU = True` routes the CPU through the handler too (the C++
emulation on the host), which the tests use to compare the handler with the Python emulation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from qmesh.jax import emulation
from qmesh.jax.common import F32

_HANDLER_ON_CPU = False


def uses_handler(device=None) -> bool:
    """Whether the GEMMs on `device` (default jax.devices()[0]) go through the handler."""
    device = jax.devices()[0] if device is None else device
    return device.platform == "gpu" or (_HANDLER_ON_CPU and device.platform == "cpu")


def handler_gemm(a, a_scale, a_scale_inv, b, b_scale, b_scale_inv, *, emulate: bool):
    """A [M, K] @ B [N, K]^T in float32 through qmesh_microscaled_gemm, each operand its copy
    along K: MXFP8 codes [rows, K] with float8_e8m0fnu scales [rows, K / 32] (scale_inv None),
    or NVFP4 packed codes uint8 [rows, K / 2] with float8_e4m3fn scales [rows, K / 16] and the
    float32 [1] per-tensor scale_inv. emulate: run the C++ emulation where the device has no
    native GEMM (without it, such a device raises qmesh's error). Under jax.vmap the GEMMs
    of the batch run one after another (the drop-ins' batch dimensions, flax/batch.py)."""
    one = jnp.ones((1,), F32)
    a_scale_inv = one if a_scale_inv is None else a_scale_inv
    b_scale_inv = one if b_scale_inv is None else b_scale_inv
    d = jax.ShapeDtypeStruct((a.shape[0], b.shape[0]), F32)
    call = jax.ffi.ffi_call("qmesh_microscaled_gemm", d, vmap_method="sequential")
    return call(a, a_scale, a_scale_inv, b, b_scale, b_scale_inv, emulate=bool(emulate))


def gemm(fmt: str, recipe, a, b, python_emulation):
    """A @ B^T in float32 for the copies a, b (data, scale[, scale_inv]) along K of `fmt`
    ("MXFP8" or "NVFP4") operands: the handler where uses_handler(), else
    python_emulation(a, b). Counts the GEMM when it runs emulated."""
    device = jax.devices()[0]
    if not emulation.runs_natively(device):
        emulation.count(fmt)
    if not uses_handler(device):
        return python_emulation(a, b)
    a_si = a[2] if len(a) > 2 else None
    b_si = b[2] if len(b) > 2 else None
    return handler_gemm(
        a[0], a[1], a_si, b[0], b[1], b_si, emulate=emulation.emulation_requested(recipe)
    )
