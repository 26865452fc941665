"""Loads qmesh's XLA FFI handler library and registers its handlers with JAX.

The library (libqmesh_jax_ffi.so) is found in the package's lib/ folder, or in the folder named
by QMESH_JAX_LIBRARY_DIR (a build tree). It records the jaxlib version whose FFI headers it was
compiled against; loading it into another jaxlib minor version fails here, naming both, instead
of failing later with XLA's "No registered implementation for custom call".
"""

from __future__ import annotations

import ctypes
import os
import pathlib

import jax
import jaxlib

# The handler symbols (Qmesh<Name>Cpu / Qmesh<Name>Cuda) and their FFI target names.
HANDLERS = {
    "Quantize": "qmesh_quantize",
    "Amax": "qmesh_amax",
    "CurrentScale": "qmesh_current_scale",
    "Dequantize": "qmesh_dequantize",
    "DbiasQuantize": "qmesh_dbias_quantize",
    "GeluQuantize": "qmesh_gelu_quantize",
    "GeluAmax": "qmesh_gelu_amax",
    "DgeluDbiasQuantize": "qmesh_dgelu_dbias_quantize",
    "DgeluAmax": "qmesh_dgelu_amax",
    "GroupedQuantize": "qmesh_grouped_quantize",
    "BlockQuantize": "qmesh_block_quantize",
    "BlockDbiasQuantize": "qmesh_block_dbias_quantize",
    "GroupedBlockQuantize": "qmesh_grouped_block_quantize",
    "BlockDequantize": "qmesh_block_dequantize",
    "Mxfp8Quantize": "qmesh_mxfp8_quantize",
    "Mxfp8DbiasQuantize": "qmesh_mxfp8_dbias_quantize",
    "Mxfp8Dequantize": "qmesh_mxfp8_dequantize",
    "Nvfp4Quantize": "qmesh_nvfp4_quantize",
    "Nvfp4Dequantize": "qmesh_nvfp4_dequantize",
    "Nvfp4Amax": "qmesh_nvfp4_amax",
    "GroupedMxfp8Quantize": "qmesh_grouped_mxfp8_quantize",
    "GroupedNvfp4Quantize": "qmesh_grouped_nvfp4_quantize",
    "DelayedScalingUpdate": "qmesh_delayed_scaling_update",
    "Gemm": "qmesh_gemm",
    "MicroscaledGemm": "qmesh_microscaled_gemm",
    "LayerNormForward": "qmesh_layer_norm_forward",
    "LayerNormBackward": "qmesh_layer_norm_backward",
    "NormForward": "qmesh_norm_forward",
    "AllGatherGemm": "qmesh_all_gather_gemm",
    "GemmReduceScatter": "qmesh_gemm_reduce_scatter",
}

_LIBRARY_NAME = "libqmesh_jax_ffi.so"


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def check_versions(built_with: str, installed: str) -> None:
    """Raises ImportError unless `installed` jaxlib has the major.minor `built_with` names."""
    if _minor(built_with) != _minor(installed):
        raise ImportError(
            f"qmesh's JAX handlers were compiled against jaxlib {built_with}, but jaxlib "
            f"{installed} is installed. Install a jax/jaxlib "
            f"{'.'.join(built_with.split('.')[:2])}.x, "
            "or rebuild qmesh in this environment: pip install --no-build-isolation "
            "--force-reinstall <qmesh>/python"
        )


def library_path() -> pathlib.Path:
    folder = os.environ.get("QMESH_JAX_LIBRARY_DIR")
    base = (
        pathlib.Path(folder) if folder else pathlib.Path(__file__).resolve().parent.parent / "lib"
    )
    path = base / _LIBRARY_NAME
    if not path.exists():
        raise ImportError(
            f"qmesh's JAX handler library is not at {path}: install the package with "
            "`pip install <qmesh>/python`, or point QMESH_JAX_LIBRARY_DIR at a build tree's src/ "
            "folder (cmake -DQMESH_WITH_JAX=ON)"
        )
    return path


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path()))
    lib.qmesh_jax_built_with_jaxlib.restype = ctypes.c_char_p
    lib.qmesh_jax_set_cpu_thread_limit.argtypes = [ctypes.c_int]
    lib.qmesh_jax_make_local_comm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    lib.qmesh_jax_make_local_comm.restype = ctypes.c_int64
    check_versions(lib.qmesh_jax_built_with_jaxlib().decode(), jaxlib.__version__)
    return lib


library = _load()
has_cuda = bool(library.qmesh_jax_has_cuda())
built_with_jaxlib = library.qmesh_jax_built_with_jaxlib().decode()

for _symbol, _target in HANDLERS.items():
    jax.ffi.register_ffi_target(
        _target, jax.ffi.pycapsule(getattr(library, f"Qmesh{_symbol}Cpu")), platform="cpu"
    )
    if has_cuda:
        jax.ffi.register_ffi_target(
            _target, jax.ffi.pycapsule(getattr(library, f"Qmesh{_symbol}Cuda")), platform="CUDA"
        )


def cap_cpu_threads() -> int:
    """Caps qmesh's host threads per op at cores / local CPU devices (XLA runs every CPU
    device on a thread of its own, so the ops of all devices together fit the cores).
    Returns the cap. QMESH_CPU_THREADS, when set, still wins below the cap."""
    devices = max(1, jax.local_device_count("cpu"))
    cap = max(1, (os.cpu_count() or 1) // devices)
    library.qmesh_jax_set_cpu_thread_limit(cap)
    return cap
