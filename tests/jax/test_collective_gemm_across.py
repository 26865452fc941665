"""Collective GEMMs with the tensor-parallel axis across processes (jax.distributed, 2
processes x 2 CPU devices, UCX communicators bootstrapped through jax.distributed's key-value
store): the overlap modes bit for bit, XLA's path within rounding, and a process that never
makes its ranks."""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from test_collective_gemm import MODES

from qmesh.jax import _ffi
from qmesh.jax.comm_registry import communicator

HERE = os.path.dirname(os.path.abspath(__file__))
JAXRUN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "launch", "jaxrun")
SCRIPT = os.path.join(HERE, "collective_gemm_processes.py")

needs_ucx = pytest.mark.skipif(
    not _ffi.library.qmesh_jax_comm_backends() & 1, reason="qmesh built without UCX"
)


def _env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    # TCP over loopback (docs/jax.md): deterministic on a loaded machine.
    env.setdefault("UCX_TLS", "tcp,self")
    env.setdefault("UCX_NET_DEVICES", "lo")
    return env


# tp_dp meets through jax.distributed's key-value store, tp4 through a FileStore.
LAYOUTS = ("tp_dp", "tp4@files")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """collective_gemm_processes.py as 2 processes x 2 devices, once for the tests below: a
    missing process, then the layouts."""
    jaxrun = [JAXRUN, "-n", "2", "--cpu-devices", "2", "--", sys.executable, SCRIPT]
    cmd = [*jaxrun, "missing", *LAYOUTS, "dp_tp:none"]
    env = dict(_env(), QMESH_TEST_STORE_DIR=str(tmp_path_factory.mktemp("store")))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@needs_ucx
def test_tp_axis_across_two_processes(run):
    """dp=2 x tp=2 with each tp group across the processes (jax.distributed's store), and tp=4
    over both processes (two ranks of one UCX world per process; QMESH_JAX_STORE_DIR): the
    modes give the bits of "none", which are the local backend's and agree with
    collective_gemm=None within the GEMM's rounding."""
    records = [json.loads(line) for line in run.splitlines() if line.startswith("{")]
    got = {(r["layout"], r["variant"]): [float.fromhex(v) for v in r["checksums"]] for r in records}
    want = {(layout, v) for layout in LAYOUTS for v in ("None", *MODES)}
    assert set(got) == {*want, ("dp_tp:none", "none")}
    for layout in LAYOUTS:
        for mode in ("ring", "bidir"):
            assert got[layout, mode] == got[layout, "none"], (layout, mode)
        np.testing.assert_allclose(got[layout, "none"], got[layout, "None"], rtol=1e-5)
    # The UCX rings give the local rings' bits (dp_tp: tp inside each process), all but fc2's
    # bias gradient, which XLA all-reduces over processes that the layouts group differently.
    assert got["tp_dp", "none"][:-1] == got["dp_tp:none", "none"][:-1]


@needs_ucx
def test_a_process_that_never_joins_is_a_timeout(run):
    """Process 1 never makes its ranks of the tp=4 communicator: process 0's creation fails
    after the 1 s timeout (jax.distributed's store) with an error naming the missing rank, not
    a hang."""
    assert "ERROR collective_gemm: cannot make the UCX communicator" in run, run
    assert re.search(r"rank \d never joined .* within \d+ ms", run), run


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
def test_nccl_communicator_on_one_gpu():
    """On a GPU the communicator is NCCL (one rank here, its unique id through a private file
    store), made once and reused; a build without NCCL refuses with an error naming it."""
    mesh = jax.make_mesh((1,), ("tp",), devices=jax.devices()[:1])
    if not _ffi.library.qmesh_jax_comm_backends() & 2:
        with pytest.raises(NotImplementedError, match="built without NCCL"):
            communicator(mesh, "tp", timeout_s=30)
        return
    first = communicator(mesh, "tp", timeout_s=30)
    assert first >= 0 and communicator(mesh, "tp", timeout_s=30) == first
