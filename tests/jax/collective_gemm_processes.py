"""A sequence-parallel LayerNormMLP step (forward + backward, DelayedScaling) on a dp x tp
mesh of 4 CPU devices, with collective_gemm None, "none", "ring" and "bidir"; prints one
JSON line of checksums per layout and variant (the loss and the sum of squares of every
gradient, as float.hex). Run as 2 processes x 2 devices (launch/jaxrun -n 2 --cpu-devices 2)
or as one process with 4 devices (no JAX_NUM_PROCESSES); used by test_collective_gemm.py.
Arguments: the layouts to run (default dp_tp): dp_tp (dp=2 across the processes, tp=2 inside
each), tp_dp (dp=2 inside each process, tp=2 across the processes), tp4 (dp=1, tp=4 over both
processes), each with the suffix @files to bootstrap through a FileStore in
$QMESH_TEST_STORE_DIR instead of jax.distributed's key-value store and/or :VARIANT to run that
variant alone (e.g. tp4@files, dp_tp:none), missing (process 0 makes a
tp=4 communicator with a 1 s timeout while process 1 never does: prints the error)."""

import json
import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", int(os.environ.get("JAX_NUM_CPU_DEVICES", "4")))
if "JAX_NUM_PROCESSES" in os.environ:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        os.environ["JAX_COORDINATOR_ADDRESS"],
        int(os.environ["JAX_NUM_PROCESSES"]),
        int(os.environ["JAX_PROCESS_ID"]),
    )

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh  # noqa: E402
from sp_mlp import X_SPEC, place, place_layer, sp_layernorm_mlp  # noqa: E402

import qmesh.jax as qj  # noqa: E402
from qmesh.jax.dense import init_state  # noqa: E402


def make_mesh(layout):
    # Rows: the processes (process 0's devices first), columns: the devices of a process.
    grid = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))).reshape(2, 2)
    grid = {"dp_tp": grid, "tp_dp": grid.T, "tp4": grid.reshape(1, 4)}[layout]
    return Mesh(grid, ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)


def missing():
    """Process 0 makes the tp=4 communicator with a 1 s timeout, process 1 never does."""
    from jax._src import distributed

    from qmesh.jax.comm_registry import communicator

    client = distributed.global_state.client
    if jax.process_index() == 0:
        try:
            communicator(make_mesh("tp4"), "tp", timeout_s=1.0)
        except RuntimeError as e:
            print("ERROR", e, flush=True)
        client.key_value_set("missing.done", "1")
    else:  # never joins; waits until process 0 has seen the error
        client.blocking_key_value_get("missing.done", 60_000)


rng = np.random.default_rng(7)
b, s, h, f = 2, 32, 64, 128
x_host = rng.standard_normal((b, s, h))
kernels_host = (rng.standard_normal((h, f)) / 8, rng.standard_normal((f, h)) / 8)
biases_host = (rng.standard_normal(f), rng.standard_normal(h))
recipe = qj.DelayedScaling()
gamma, beta = jnp.ones(h), jnp.zeros(h)


def step(cg):
    def loss(x, kernels, biases, states):
        y, _ = sp_layernorm_mlp(
            x, gamma, beta, kernels, biases, states, recipe=recipe, collective_gemm=cg
        )
        return jnp.mean(y * y)

    def checked(*args):
        value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(*args)
        return value, [
            jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree_util.tree_leaves(grads)
        ]

    return jax.jit(checked)


resource = qj.MeshResource(dp_resource="dp", tpsp_resource="tp", tp_resource="tp")
for arg in sys.argv[1:] or ["dp_tp"]:
    if arg == "missing":
        missing()
        continue
    spec, _, only = arg.partition(":")
    layout, _, store = spec.partition("@")
    # "@files": the communicators meet through a FileStore in $QMESH_TEST_STORE_DIR.
    os.environ.pop("QMESH_JAX_STORE_DIR", None)
    if store == "files":
        os.environ["QMESH_JAX_STORE_DIR"] = os.environ["QMESH_TEST_STORE_DIR"]
    mesh = make_mesh(layout)
    x = place(mesh, x_host, X_SPEC)
    kernels, biases = place_layer(mesh, kernels_host, biases_host)
    with jax.set_mesh(mesh), qj.global_shard_guard(resource):
        for cg in (None, "none", "ring", "bidir"):
            if only and str(cg) != only:
                continue
            states = (init_state(recipe), init_state(recipe))
            value, sums = step(cg)(x, kernels, biases, states)
            record = [float(value).hex()] + [float(v).hex() for v in sums]
            if jax.process_index() == 0:
                line = {"layout": arg, "variant": str(cg), "checksums": record}
                print(json.dumps(line), flush=True)
