"""The collective GEMMs on a CUDA GPU: the CUDA handlers over an NCCL communicator, with the one
NCCL world a single GPU can host (a tp=1 mesh, one rank: the rings' one-rank schedule, NCCL's
gather of the one chunk on the rank's transfer stream, the GEMMs on XLA's stream). The
sequence-parallel LayerNormMLP (delayed scaling) and dense column-then-row (current scaling,
bf16) forward and backward: "ring" gives the bits of "none", and XLA's path
(collective_gemm=None) agrees within the GEMMs' rounding; a CUDA call on a communicator
without an NCCL rank is refused with an error that says what to do. Skipped where JAX sees no
GPU (CI); run on a GPU machine by launch/gpu_check.sh (step jax)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref
from jax.sharding import AxisType
from test_collective_gemm import SP, column_then_row, leaves_equal, mlp_data, mlp_step, sp_args

import qmesh.jax as qj
from qmesh.jax import _ffi
from qmesh.jax.dense import init_state

GPU = jax.devices()[0] if jax.default_backend() == "gpu" else None
pytestmark = [
    pytest.mark.skipif(GPU is None, reason="JAX sees no GPU"),
    pytest.mark.skipif(
        not _ffi.library.qmesh_jax_comm_backends() & 2, reason="qmesh built without NCCL"
    ),
]
MODES = (None, "none", "ring")
# XLA's path and the rings run the same FP8 (or bf16) GEMMs on the same codes, but not through
# the same cuBLASLt call (the layer's planned GEMM with XLA's workspace, the ring's chunk GEMM
# with qmesh's cached one), so their algorithms and sums may differ: within float32 rounding of
# the sums, bf16 rounding for bf16 outputs.
TOL = {jnp.float32: 1e-3, jnp.bfloat16: 2e-2}


def gpu_mesh():
    return jax.make_mesh((1, 1), ("dp", "tp"), devices=[GPU], axis_types=(AxisType.Auto,) * 2)


def test_layernorm_mlp_on_one_gpu(rng):
    """Two delayed-scaling steps of a sequence-parallel LayerNormMLP, fwd + bwd, on tp=1."""
    mesh = gpu_mesh()
    x, gamma, beta, kernels, biases, r = mlp_data(rng, b=2)
    recipe = qj.DelayedScaling()
    with jax.set_mesh(mesh), qj.global_shard_guard(SP):
        args, r = sp_args(mesh, x, gamma, beta, kernels, biases, r)
        results = {}
        for cg in MODES:
            states, step = (init_state(recipe), init_state(recipe)), mlp_step(cg)
            for _ in range(2):
                out = step(*args, states, r)
                states = out[1][5]
            results[cg] = jax.tree.map(np.asarray, out)
    assert leaves_equal(results["ring"], results["none"])
    ref.assert_trees_close(results["none"], results[None], tol=TOL[jnp.float32])


def test_dense_column_then_row_on_one_gpu(rng):
    """dense(gelu) column parallel then dense row parallel, current scaling, bf16, tp=1."""
    results = column_then_row(rng, gpu_mesh(), qj.Float8CurrentScaling(), jnp.bfloat16, MODES)
    assert leaves_equal(results["ring"], results["none"])
    ref.assert_trees_close(results["none"], results[None], tol=TOL[jnp.bfloat16])


def test_a_communicator_without_nccl_rank_is_refused(rng):
    """The CUDA handler on a local communicator (what a mesh of unknown devices would get on the
    CPU) is an error naming the fix, not a read of device memory from the host."""
    local = _ffi.library.qmesh_jax_make_local_comm(1, 1, 0)
    assert local >= 0
    a = jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((4, 16)), jnp.float32)
    one, coords = jnp.ones((1,), jnp.float32), jnp.zeros((2,), jnp.int32)
    call = jax.ffi.ffi_call("qmesh_gemm_reduce_scatter", jax.ShapeDtypeStruct((8, 4), jnp.float32))
    ring = jax.jit(
        lambda a, b: call(
            a,
            b,
            one,
            one,
            coords,
            comm=np.int64(local),
            overlap=np.int32(1),
            trans_b=True,
            split_accumulator=False,
            a_block=np.int32(0),
            b_block=np.int32(0),
        )
    )
    with pytest.raises(Exception, match="has no NCCL rank on CUDA device .*jax.set_mesh"):
        jax.block_until_ready(ring(jax.device_put(a, GPU), jax.device_put(b, GPU)))
