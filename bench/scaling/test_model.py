"""Unit tests of bench/scaling/model.py against hand-computed values and known identities.

    python3 -m unittest discover -s bench/scaling -p 'test_*.py'
"""
import contextlib
import dataclasses
import io
import unittest
from unittest import mock

import model

# An ideal device: every FLOP at peak, no other work, no latency, perfect overlaps off.
IDEAL = model.Hardware("ideal", bf16_flops=1e12, fp8_flops=2e12, gemm_efficiency=1.0,
                       attention_efficiency=1.0, other_fraction=0.0, intra_bw=1e9, inter_bw=1e8,
                       latency=0.0, devices_per_node=4, dp_overlap=0.0, tp_overlap=0.0)
TINY = model.Transformer("tiny", layers=2, hidden=4, ffn=16, seq=8, vocab=10, global_batch=4)


class AllReduce(unittest.TestCase):
    def test_one_rank_is_free(self):
        self.assertEqual(model.all_reduce_time(1e9, 1, 1e9, 1e-3), 0.0)

    def test_ring_bandwidth_term(self):
        # 4 ranks: each sends 2 * 3/4 of 4 GB at 1 GB/s = 6 s.
        self.assertAlmostEqual(model.all_reduce_time(4e9, 4, 1e9, 0.0), 6.0)

    def test_ring_latency_term(self):
        # 8 ranks: 2 * 7 steps of 10 us, no bytes.
        self.assertAlmostEqual(model.all_reduce_time(0, 8, 1e9, 1e-5), 14e-5)


class TransformerCounts(unittest.TestCase):
    def test_params(self):
        # per layer 4 h^2 + 2 h ffn = 64 + 128 = 192; 2 layers; embedding 10 x 4.
        self.assertEqual(TINY.linear_params(), 384)
        self.assertEqual(TINY.params(), 424)

    def test_flops_per_token(self):
        linear, other = TINY.flops_per_token()
        self.assertEqual(linear, 6 * 384)
        self.assertEqual(other, 3 * 4 * 2 * 8 * 4 + 6 * 10 * 4)


class Predict(unittest.TestCase):
    def test_single_ideal_device_has_mfu_one(self):
        r = model.predict(TINY, model.Layout(dp=1, tp=1), IDEAL)
        tokens = 4 * 8
        flops = tokens * sum(TINY.flops_per_token())
        self.assertAlmostEqual(r["step_s"], flops / 1e12)
        self.assertAlmostEqual(r["mfu"], 1.0)
        self.assertEqual(r["exposed_comm_s"], 0.0)

    def test_data_parallel_gradient_reduction_without_overlap(self):
        r = model.predict(TINY, model.Layout(dp=8, tp=1), IDEAL)
        # 8 devices on 2 nodes: BF16 gradients (2 bytes x 424) over the inter-node link.
        expected = 2 * 7 / 8 * (2 * 424) / 1e8
        self.assertAlmostEqual(r["dp_comm_s"], expected)
        self.assertAlmostEqual(r["exposed_comm_s"], expected)
        self.assertAlmostEqual(r["step_s"], r["compute_s"] + expected)

    def test_fsdp_moves_one_and_a_half_times_the_bytes(self):
        ddp = model.predict(TINY, model.Layout(dp=8, tp=1), IDEAL)
        fsdp = model.predict(TINY, model.Layout(dp=8, tp=1, fsdp=True), IDEAL)
        self.assertAlmostEqual(fsdp["dp_comm_s"], 1.5 * ddp["dp_comm_s"])

    def test_full_overlap_hides_a_small_reduction(self):
        hw = dataclasses.replace(IDEAL, dp_overlap=1.0, inter_bw=1e18, intra_bw=1e18)
        r = model.predict(TINY, model.Layout(dp=8, tp=1), hw)
        self.assertEqual(r["exposed_comm_s"], 0.0)

    def test_tp_across_nodes_uses_the_slower_link(self):
        inside = model.predict(TINY, model.Layout(dp=1, tp=4), IDEAL)
        across = model.predict(TINY, model.Layout(dp=1, tp=8), IDEAL)
        act = 2 * 4 * 8 * 4  # BF16 activations of the replica's 32 tokens
        self.assertAlmostEqual(inside["tp_comm_s"], 4 * 2 * model.all_reduce_time(act, 4, 1e9, 0))
        self.assertAlmostEqual(across["tp_comm_s"], 4 * 2 * model.all_reduce_time(act, 8, 1e8, 0))

    def test_fp8_speedup_is_bounded_by_the_linear_share(self):
        big = model.Transformer("big", layers=4, hidden=1024, ffn=4096, seq=512, vocab=1000,
                                global_batch=8)
        bf16 = model.predict(big, model.Layout(dp=1, tp=1), IDEAL)["step_s"]
        fp8 = model.predict(big, model.Layout(dp=1, tp=1), IDEAL, fp8=True)["step_s"]
        linear, other = big.flops_per_token()
        # Only the linear GEMMs run twice as fast (Amdahl).
        self.assertAlmostEqual(bf16 / fp8, (linear + other) / (linear / 2 + other))
        self.assertGreater(bf16 / fp8, 1.0)
        self.assertLess(bf16 / fp8, 2.0)


class TrainMlp(unittest.TestCase):
    CAL = model.CpuCalibration(s_per_flop=1e-10, latency=1e-4, bus_bw=1e8)

    def test_one_rank_is_pure_compute(self):
        r = model.predict_train_mlp(2, 8, 32, 16, dp=1, tp=1, cal=self.CAL, small_collectives=0)
        self.assertAlmostEqual(r["step_s"], 12.0 * 16 * 8 * 32 * 2 * 1e-10)
        self.assertEqual(r["comm_s"], 0.0)

    def test_data_parallel_adds_the_gradient_all_reduce(self):
        two = model.predict_train_mlp(2, 8, 32, 16, dp=2, tp=1, cal=self.CAL, small_collectives=0)
        grads = 4.0 * 2 * (2 * 8 * 32 + 32 + 3 * 8)  # fp32 weights, biases, norm parameters
        self.assertAlmostEqual(two["comm_s"], 2 * 1e-4 + grads / 1e8)
        self.assertAlmostEqual(two["compute_s"], 12.0 * 16 * 8 * 32 * 2 * 1e-10)


class CommandLine(unittest.TestCase):
    def test_png_without_matplotlib_is_one_clear_error(self):
        """Refused before any output (before: the table, the JSON, then an ImportError)."""
        err = io.StringIO()
        with mock.patch("importlib.util.find_spec", return_value=None), \
                contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
            with self.assertRaises(SystemExit) as exit_:
                model.main(["h100", "--png", "never-written.png"])
        self.assertEqual(exit_.exception.code, 2)
        self.assertIn("--png needs matplotlib", err.getvalue())
        self.assertEqual(out.getvalue(), "")


if __name__ == "__main__":
    unittest.main()
