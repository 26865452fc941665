"""launch/ncu_layer_summary.py on a hand-written Nsight Compute CSV (data/ncu-flax-sample.csv:
program output before ncu's header, two steps of nine kernels with times in ns, us and ms,
thousands separators, a comma inside a quoted kernel name, and one row of another metric).

    python3 -m unittest discover -s tests/tools -p 'test_*.py'
"""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "launch"))

import ncu_layer_summary as summary  # noqa: E402

SAMPLE = os.path.join(HERE, "data", "ncu-flax-sample.csv")
QMESH_CAST = "qmesh::<unnamed>::cast_tiled_kernel<qmesh::Bf16, 1, 2>"  # as ncu prints it
# One step of the sample, by hand: ms per category.
EXPECTED_MS = {
    "qmesh": 0.010,  # cast_tiled_kernel 10,000 ns
    "attention": 0.4 + 0.1,  # cuDNN sdpa flash 0.4 ms, triton_softmax_fusion_2 100 us
    "gemm": 1.5 + 0.8,  # nvjet 1,500,000 ns, sm90_xmma_gemm 800 us
    "copy": 0.020,  # loop_transpose_fusion 20 us
    "xla_fusion": 0.050 + 0.030,  # loop_add_fusion_3 50 us, input_reduce_fusion_1 30 us
    "other": 0.002,  # redzone_checker 2,000 ns
}


class CategoryTest(unittest.TestCase):
    def test_names(self):
        cases = {
            "void qmesh::detail::cuda::(anonymous namespace)::norm_kernel(NormJob, bool)": "qmesh",
            "_ZN5qmesh6detail4cuda12_GLOBAL__N_117cast_tiled_kernelENS2_10TileParamsE": "qmesh",
            "flash_bwd_kernel": "attention",
            "fmha_cutlassF_bf16_aligned_64x64_rf_sm80": "attention",
            "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN": "gemm",
            "gemm_fusion_dot_12": "gemm",
            "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>(Params)": "gemm",
            "splitKreduce_kernel": "gemm",
            "void cublasLt::globalKernel<8, 32, float, float, float, 1, 0, 4>(float*)": "gemm",
            "qmesh::<unnamed>::layer_norm_dx_kernel(qmesh::<unnamed>::DxJob)": "qmesh",
            "copy_fusion_4": "copy",
            "input_transpose_fusion_2": "copy",
            "loop_convert_fusion": "xla_fusion",
            "wrapped_exponential": "xla_fusion",
            "triton_reduction_fusion": "xla_fusion",
            "redzone_checker": "other",
        }
        for name, expected in cases.items():
            with self.subTest(name=name):
                self.assertEqual(summary.category(name), expected)

    def test_short_name_drops_return_type_and_parameters(self):
        self.assertEqual(
            summary.short_name(
                "void qmesh::detail::cuda::(anonymous namespace)::cast_tiled_kernel<float>"
                "(qmesh::detail::cuda::(anonymous namespace)::TileParams)"
            ),
            "qmesh::detail::cuda::(anonymous namespace)::cast_tiled_kernel<float>",
        )
        self.assertEqual(summary.short_name("loop_add_fusion_3"), "loop_add_fusion_3")


class SummarizeTest(unittest.TestCase):
    def test_categories_and_sums_per_step(self):
        s = summary.summarize(SAMPLE, steps=2)
        self.assertEqual(s["launches_per_step"], 9)
        self.assertEqual(set(s["ms_per_step"]), set(EXPECTED_MS))
        for c, ms in EXPECTED_MS.items():
            self.assertAlmostEqual(s["ms_per_step"][c], ms, places=9, msg=c)
        self.assertAlmostEqual(s["total_ms_per_step"], sum(EXPECTED_MS.values()), places=9)

    def test_costliest_kernels(self):
        top = summary.summarize(SAMPLE, steps=2)["top_kernels"]
        self.assertEqual(len(top), 9)  # at most summary.TOP: the sample has nine kernels
        self.assertEqual(
            [(k["kernel"][:20], k["category"]) for k in top[:3]],
            [
                ("nvjet_tst_256x128_64", "gemm"),
                ("sm90_xmma_gemm_e4m3b", "gemm"),
                ("cudnn_generated_fort", "attention"),
            ],
        )
        self.assertAlmostEqual(top[0]["ms_per_step"], 1.5)
        self.assertEqual(top[0]["launches_per_step"], 1)
        ms = [k["ms_per_step"] for k in top]
        self.assertEqual(ms, sorted(ms, reverse=True))
        self.assertIn(QMESH_CAST, [k["kernel"] for k in top])


class MainTest(unittest.TestCase):
    def run_main(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = summary.main(list(argv))
        return rc, out.getvalue(), err.getvalue()

    def test_writes_json_and_table(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ncu-flax.json")
            rc, out, _ = self.run_main("--steps", "2", "--json", path, SAMPLE)
            self.assertEqual(rc, 0)
            with open(path) as f:
                written = json.load(f)
        self.assertEqual(list(written), ["sample"])
        self.assertAlmostEqual(written["sample"]["ms_per_step"]["gemm"], 2.3)
        self.assertIn("| sample | 2.912 |", out)

    def test_a_file_without_kernels_fails_and_says_why(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ncu-flax-bf16.csv")
            with open(path, "w") as f:
                f.write("==PROF== Connected to process 1\nno CUDA runtime found\n")
            rc, _, err = self.run_main(path)
        self.assertEqual(rc, 1)
        self.assertIn("no gpu__time_duration.sum rows", err)

    def test_a_file_named_otherwise_is_refused(self):
        with self.assertRaises(SystemExit) as e:
            self.run_main("profile.csv")
        self.assertEqual(e.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
