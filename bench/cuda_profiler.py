"""cudaProfilerStart/cudaProfilerStop through ctypes, so that a profiler started with profiling
off (`ncu --profile-from-start off`) records only the code between them (the benchmarks' timed
steps, not compilation or autotuning).

The CUDA runtime library (libcudart) is looked for in this order:
  1. one already loaded into this process (JAX's CUDA plugin loads the one it runs on),
  2. the NVIDIA wheels that jax[cuda12] / jax[cuda13] install (nvidia/cu13/lib,
     nvidia/cuda_runtime/lib under site-packages),
  3. the dynamic loader's search path: libcudart.so.13, libcudart.so.12, libcudart.so,
  4. a CUDA toolkit: $CUDA_HOME, $CUDA_PATH, $CUDA_ROOT, the nvcc on PATH, /usr/local/cuda
     (lib64, lib, targets/*/lib).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import shutil

SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


def loaded_cudarts(maps: str = "/proc/self/maps") -> list[str]:
    """Paths of the libcudart libraries mapped into this process."""
    try:
        with open(maps) as f:
            paths = [line.split()[-1] for line in f if len(line.split()) >= 6]
    except OSError:
        return []
    return [p for p in dict.fromkeys(paths) if os.path.basename(p).startswith("libcudart.so")]


def wheel_cudarts() -> list[str]:
    """libcudart of the installed nvidia-* wheels (the namespace package `nvidia`)."""
    try:
        import nvidia  # only present with the CUDA wheels
    except ImportError:
        return []
    found = []
    for root in getattr(nvidia, "__path__", []):
        found += sorted(glob.glob(os.path.join(root, "*", "lib", "libcudart.so*")))
    return found


def toolkit_cudarts(env=os.environ) -> list[str]:
    """libcudart of the CUDA toolkits that the environment and PATH point at."""
    roots = [env.get(k) for k in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    nvcc = shutil.which("nvcc")
    roots += [os.path.dirname(os.path.dirname(nvcc)) if nvcc else None, "/usr/local/cuda"]
    found = []
    for root in filter(None, roots):
        for lib in ("lib64", "lib", os.path.join("targets", "*", "lib")):
            found += sorted(glob.glob(os.path.join(root, lib, "libcudart.so*")))
    return found


def candidates() -> list[str]:
    """Every libcudart to try, in the order of the module's docstring, without repeats."""
    return list(
        dict.fromkeys(loaded_cudarts() + wheel_cudarts() + list(SONAMES) + toolkit_cudarts())
    )


def load_cudart(names: list[str] | None = None):
    """The first of `names` (default: candidates()) that loads and has cudaProfilerStart.
    Raises RuntimeError naming every library tried and why it was refused."""
    tried = []
    for name in candidates() if names is None else names:
        try:
            lib = ctypes.CDLL(name)
            lib.cudaProfilerStart, lib.cudaProfilerStop  # both must exist
            return lib
        except (OSError, AttributeError) as e:
            tried.append(f"{name} ({e})")
    raise RuntimeError(
        "no CUDA runtime library (libcudart) to call cudaProfilerStart from; tried: "
        + ("; ".join(tried) or "nothing")
        + ". Install the CUDA wheels of your jax (pip install 'jax[cuda13]') or put a CUDA "
        "toolkit's lib64 on LD_LIBRARY_PATH"
    )


def _check(cudart, status: int, call: str) -> None:
    if status != 0:
        describe = getattr(cudart, "cudaGetErrorString", None)
        text = ""
        if describe is not None:
            describe.restype = ctypes.c_char_p
            text = f": {describe(status).decode()}"
        raise RuntimeError(f"{call} returned CUDA error {status}{text}")


@contextlib.contextmanager
def profiled(cudart):
    """Runs the body between cudaProfilerStart() and cudaProfilerStop() of `cudart` (from
    load_cudart). The caller waits for the body's GPU work before leaving it."""
    _check(cudart, cudart.cudaProfilerStart(), "cudaProfilerStart")
    try:
        yield
    finally:
        _check(cudart, cudart.cudaProfilerStop(), "cudaProfilerStop")
