"""bench/cuda_profiler.py without a GPU: where it looks for libcudart, the error that names
what it tried, and the start/stop around the profiled code (on a stand-in runtime).

    python3 -m unittest discover -s tests/tools -p 'test_*.py'
"""

import ctypes.util
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

import cuda_profiler  # noqa: E402


class FakeRuntime:
    """cudaProfilerStart/Stop that record their calls and return the given statuses."""

    def __init__(self, start=0, stop=0):
        self.calls, self.status = [], {"start": start, "stop": stop}

    def cudaProfilerStart(self):
        self.calls.append("start")
        return self.status["start"]

    def cudaProfilerStop(self):
        self.calls.append("stop")
        return self.status["stop"]


class LookupTest(unittest.TestCase):
    def test_loaded_libraries_from_the_process_maps(self):
        with tempfile.NamedTemporaryFile("w", suffix=".maps", delete=False) as f:
            f.write(
                "7f00-7f10 r--p 00000000 08:01 12 /site-packages/nvidia/cu13/lib/libcudart.so.13\n"
                "7f10-7f20 r-xp 00010000 08:01 12 /site-packages/nvidia/cu13/lib/libcudart.so.13\n"
                "7f20-7f30 r--p 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
                "7f30-7f40 rw-p 00000000 00:00 0 \n"
            )
        try:
            found = cuda_profiler.loaded_cudarts(f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual(found, ["/site-packages/nvidia/cu13/lib/libcudart.so.13"])
        self.assertEqual(cuda_profiler.loaded_cudarts("/no/such/maps"), [])

    def test_toolkit_libraries_from_the_environment(self):
        with tempfile.TemporaryDirectory() as root:
            for lib in ("lib64", os.path.join("targets", "x86_64-linux", "lib")):
                os.makedirs(os.path.join(root, lib))
                open(os.path.join(root, lib, "libcudart.so.13"), "w").close()
            found = cuda_profiler.toolkit_cudarts({"CUDA_HOME": root})
        self.assertIn(os.path.join(root, "lib64", "libcudart.so.13"), found)
        self.assertIn(
            os.path.join(root, "targets", "x86_64-linux", "lib", "libcudart.so.13"), found
        )

    def test_the_error_names_every_library_tried(self):
        libc = ctypes.util.find_library("c")  # loads, but has no cudaProfilerStart
        with self.assertRaises(RuntimeError) as e:
            cuda_profiler.load_cudart(["/no/such/libcudart.so.99", libc])
        message = str(e.exception)
        self.assertIn("/no/such/libcudart.so.99", message)
        self.assertIn(libc, message)
        self.assertIn("cudaProfilerStart", message)
        self.assertIn("pip install", message)


class ProfiledTest(unittest.TestCase):
    def test_start_before_and_stop_after_the_body(self):
        runtime = FakeRuntime()
        with cuda_profiler.profiled(runtime):
            runtime.calls.append("body")
        self.assertEqual(runtime.calls, ["start", "body", "stop"])

    def test_stop_also_when_the_body_fails(self):
        runtime = FakeRuntime()
        with self.assertRaises(ValueError):
            with cuda_profiler.profiled(runtime):
                raise ValueError("step failed")
        self.assertEqual(runtime.calls, ["start", "stop"])

    def test_a_failed_start_is_an_error_and_runs_nothing(self):
        runtime = FakeRuntime(start=100)
        with self.assertRaisesRegex(RuntimeError, "cudaProfilerStart returned CUDA error 100"):
            with cuda_profiler.profiled(runtime):
                runtime.calls.append("body")
        self.assertEqual(runtime.calls, ["start"])


if __name__ == "__main__":
    unittest.main()
