"""A sequence-parallel LayerNormMLP step (forward + backward, DelayedScaling) on a dp x tp
mesh of 2 x 2 CPU devices, with collective_gemm None, "none", "ring" and "bidir"; prints one
JSON line of checksums per variant (the loss and the sum of squares of every gradient, as
float.hex). Run as 2 processes x 2 devices (launch/jaxrun -n 2 --cpu-devices 2: dp across the
processes, tp inside each) or as one process with 4 devices (no JAX_NUM_PROCESSES); used by
test_collective_gemm.py."""

import json
import os

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
from jax.sharding import AxisType  # noqa: E402
from sp_mlp import X_SPEC, place, place_layer, sp_layernorm_mlp  # noqa: E402

import qmesh.jax as qj  # noqa: E402
from qmesh.jax.dense import init_state  # noqa: E402

mesh = jax.make_mesh((2, 2), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
rng = np.random.default_rng(7)
b, s, h, f = 2, 32, 64, 128
x = place(mesh, rng.standard_normal((b, s, h)), X_SPEC)
kernels = (rng.standard_normal((h, f)) / 8, rng.standard_normal((f, h)) / 8)
kernels, biases = place_layer(mesh, kernels, (rng.standard_normal(f), rng.standard_normal(h)))
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
with jax.set_mesh(mesh), qj.global_shard_guard(resource):
    for cg in (None, "none", "ring", "bidir"):
        states = (init_state(recipe), init_state(recipe))
        value, sums = step(cg)(x, kernels, biases, states)
        record = [float(value).hex()] + [float(v).hex() for v in sums]
        if jax.process_index() == 0:
            print(json.dumps({"variant": str(cg), "checksums": record}), flush=True)
