"""bench/flax_layer_bench.py --profile-steps at a tiny size on the CPU: it profiles nothing and
says why, and given a CUDA runtime it brackets exactly the extra steps with
cudaProfilerStart/cudaProfilerStop (here a stand-in runtime, as no GPU runs these tests)."""

import json
import os
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import flax_layer_bench as bench  # noqa: E402

SIZE = dict(hidden=64, ffn=256, heads=1)  # --scale 64


class FakeRuntime:
    """Records cudaProfilerStart/Stop and how many steps ran before each."""

    def __init__(self, step_counter):
        self.calls, self.steps = [], step_counter

    def cudaProfilerStart(self):
        self.calls.append(("start", self.steps()))
        return 0

    def cudaProfilerStop(self):
        self.calls.append(("stop", self.steps()))
        return 0


def test_profile_steps_on_the_cpu_profile_nothing_and_say_so(tmp_path, capsys):
    out = tmp_path / "layer.json"
    argv = [
        "--scale",
        "64",
        "--batch",
        "1",
        "--warmup",
        "0",
        "--steps",
        "1",
        "--variants",
        "bf16",
        "--profile-steps",
        "1",
        "--json",
        str(out),
    ]
    assert bench.main(argv) == 0
    assert (
        "--profile-steps: JAX runs on cpu, which launches no CUDA kernels"
        in capsys.readouterr().out
    )
    written = json.loads(out.read_text())
    assert written["meta"]["profile_steps"] == 1
    assert written["results"][0]["profiled_steps"] == 0


def test_the_profiled_steps_run_between_start_and_stop(monkeypatch):
    waited = []  # run() waits for every step it runs (block_until_ready): one entry each
    wait = bench.jax.block_until_ready
    monkeypatch.setattr(bench.jax, "block_until_ready", lambda t: waited.append(1) or wait(t))
    runtime = FakeRuntime(lambda: len(waited))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 32, 64)), jnp.bfloat16)
    r = bench.run("qmesh_delayed", x, **SIZE, warmup=1, steps=2, cudart=runtime, profile_steps=3)
    assert runtime.calls == [("start", 3), ("stop", 6)]  # after warm-up + timed, 3 steps inside
    assert r["profiled_steps"] == 3 and r["state_advanced"]
