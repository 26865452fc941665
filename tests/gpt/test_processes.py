"""Two processes x two CPU devices (jax.distributed over gloo, started by launch/jaxrun) train
exactly as one process on four devices: the same losses and held-out losses, bit for bit."""

import json
import os
import subprocess
import sys

from conftest import EXAMPLE, ROOT, TINY

import train


def test_two_processes_equal_one(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [os.path.join(ROOT, "launch", "jaxrun"), "-n", "2", "--cpu-devices", "2", "--",
           sys.executable, os.path.join(EXAMPLE, "train.py"), *TINY, "--out", str(tmp_path / "two")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 process(es)" in done.stdout and "tokens/s" in done.stdout
    two = json.loads((tmp_path / "two" / "delayed.json").read_text())
    one = train.main([*TINY, "--out", str(tmp_path / "one")])["delayed"]
    assert two["processes"] == 2 and one["processes"] == 1 and two["devices"] == one["devices"] == 4
    assert len(one["loss"]) == 4 and len(one["held_out"]) == 2
    assert two["loss"] == one["loss"]
    assert two["held_out"] == one["held_out"]
    assert (tmp_path / "two" / "held_out_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_jaxrun_stops_on_failure(tmp_path):
    """One process failing ends the job with its status (instead of the others waiting)."""
    script = "import os, sys, time; sys.exit(3) if os.environ['JAX_PROCESS_ID'] == '1' else time.sleep(60)"
    done = subprocess.run([os.path.join(ROOT, "launch", "jaxrun"), "-n", "2", sys.executable,
                           "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 3
    assert "process 1 (JAX_PROCESS_ID) exited with status 3; stopping the others" in done.stderr


def test_error_in_one_process_ends_the_job_at_once():
    """A process that raises exits at once (not after jax.distributed's shutdown barrier, which
    would wait for the other process's 60 s of work), and jaxrun names it."""
    script = ("import os, sys, time; sys.path.insert(0, sys.argv[1]); import jax, train\n"
              "jax.config.update('jax_cpu_collectives_implementation', 'gloo')\n"
              "e = os.environ\n"
              "jax.distributed.initialize(e['JAX_COORDINATOR_ADDRESS'],"
              " int(e['JAX_NUM_PROCESSES']), int(e['JAX_PROCESS_ID']))\n"
              "def run():\n"
              "    if jax.process_index() == 1: raise RuntimeError('bad data in process 1')\n"
              "    time.sleep(60)\n"
              "train.exit_at_once_on_error(run)\n")
    done = subprocess.run([os.path.join(ROOT, "launch", "jaxrun"), "-n", "2", sys.executable,
                           "-c", script, EXAMPLE], capture_output=True, text=True, timeout=40)
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: bad data in process 1" in done.stderr
    assert "process 1 (JAX_PROCESS_ID) exited with status 1; stopping the others" in done.stderr


def test_jaxrun_option_without_its_value_is_one_clear_message():
    for option in ["-n", "--cpu-devices", "--port"]:
        done = subprocess.run([os.path.join(ROOT, "launch", "jaxrun"), option],
                              capture_output=True, text=True, timeout=10)
        assert done.returncode == 2
        assert done.stderr == f"jaxrun: {option} needs a number (see --help)\n"
