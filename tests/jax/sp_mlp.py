"""The sequence-parallel LayerNormMLP that the collective-GEMM tests and the benchmark
(bench/collective_gemm_bench.py) run: its placement on a dp x tp mesh and the layer call with
the collective-GEMM option."""

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from qmesh.jax.mlp import layernorm_mlp

# Tokens over (dp, tp) on (batch, seq); fc1 column parallel, fc2 row parallel.
X_SPEC = P("dp", "tp", None)
KERNEL_SPECS = (P(None, "tp"), P("tp", None))
BIAS_SPECS = (P("tp"), P())


def place(mesh, value, spec):
    """The host array `value` as a float32 jax.Array sharded by `spec` on `mesh` (each process
    gives its own devices' shards: works under jax.distributed)."""
    value = np.asarray(value)
    return jax.make_array_from_callback(
        value.shape, NamedSharding(mesh, spec), lambda i: value[i].astype(np.float32)
    )


def place_layer(mesh, kernels, biases):
    """(kernels, biases) placed as the layer's tensor-parallel parameters."""
    return (
        tuple(place(mesh, k, s) for k, s in zip(kernels, KERNEL_SPECS)),
        tuple(place(mesh, b, s) for b, s in zip(biases, BIAS_SPECS)),
    )


def sp_layernorm_mlp(x, gamma, beta, kernels, biases, states, *, recipe, collective_gemm):
    """(y, ln) of layernorm_mlp with the tokens of the FP8 operands on dp (XLA's path) or
    through qmesh's rings (collective_gemm "none", "ring" or "bidir")."""
    return layernorm_mlp(
        x,
        gamma,
        beta,
        kernels,
        biases,
        states,
        recipe=recipe,
        row_axes=(("dp",), ("dp",)),
        collective_gemm=collective_gemm,
    )
