"""Collective GEMMs: qmesh's all-gather + GEMM and GEMM + reduce-scatter rings
(include/qmesh/overlap/collective_gemm.h) behind the sequence-parallel GEMMs of JAX.

Under sequence parallelism the tokens (rows) of a layer's input are sharded over the tensor-
parallel axis. A column-parallel GEMM (kernel [K, N] sharded over N) needs every token: XLA
all-gathers the input, then multiplies. A row-parallel GEMM (kernel sharded over K) leaves
partial sums that XLA reduce-scatters back to token shards. The rings do both chunk by chunk
so that each transfer runs beside a GEMM, and they emit no all-gather and no reduce-scatter:
the HLO holds one custom call per GEMM instead.

Two levels:

- Layers: `dense(..., collective_gemm=CollectiveGemm("ring", "column"))`,
  `layernorm_dense(...)` likewise, `mlp` / `layernorm_mlp(..., collective_gemm="ring")` (fc1
  column parallel, fc2 row parallel) and the Flax modules' `collective_gemm` field. The axis
  is the MeshResource's tpsp_resource (else tp_resource); the rows of the token operands are
  sharded over (dp_resource when the mesh has it, then that axis) in contiguous blocks: the
  token layout of the Flax modules (flax/sharding.py, token_layout). Forward and
  backward: column parallel runs all-gather + GEMM forward and GEMM + reduce-scatter for the
  input gradient; row parallel the mirror image. The weight gradient reuses the gathered
  operand (the FP8 codes the ring gathered), as the C++ layers do.
- Ring primitives for shard_map users: `all_gather_gemm` and `gemm_reduce_scatter`, called
  per device inside a shard_map over every axis of the mesh.

Communicators (comm_registry.py): one world per index combination of the other mesh axes,
made once per (mesh, axis) by `communicator` and reused: the local backend when the axis lies
inside each process (the CPU devices of a process run on threads of their own), UCX when it
spans processes. Every wait is bounded by the communicator's timeout (QMESH_COMM_TIMEOUT_S, or
timeout_s of `communicator`): a device that never reaches the ring makes the call fail with a
timeout error, not hang.

Bits: the three overlap modes give the same bits (the C++ contract): every mode runs the same
per-chunk GEMMs and sums the partials in the same ring order. They are not the bits of XLA's
all-gather then one full GEMM (collective_gemm=None): the host GEMM's rows depend on the
number of rows M (docs/design/overlap.md), and XLA's reduce-scatter sums in its own order;
"none" (the rings' unoverlapped schedule through the same handlers) is the bitwise reference,
and collective_gemm=None agrees within the GEMM's rounding (docs/jax.md).

Several processes (jax.distributed on the CPU) work with the axis inside each process or
across processes (UCX; run the step under jax.set_mesh(mesh), which names the devices).

Refused: a token count that the batch axes times the axis do not divide (ValueError; pad the
sequence), Float8BlockScaling (the rings take per-tensor FP8 or plain operands),
GPUs (the handlers take host buffers; comm_registry makes NCCL communicators, the GPU
handlers are not done).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from qmesh.jax import sharding
from qmesh.jax.comm_registry import communicator

F32 = jnp.float32
OVERLAPS = {"none": 0, "ring": 1, "bidir": 2}
PARALLEL = ("column", "row")


@dataclasses.dataclass(frozen=True)
class CollectiveGemm:
    """How one dense layer's GEMMs run under sequence parallelism. overlap: "none" (gather,
    then the chunk GEMMs; the chunk GEMMs, then the ring sum), "ring" or "bidir" (as the C++
    Overlap); parallel: "column" (kernel sharded over its output features: all-gather + GEMM
    forward) or "row" (kernel sharded over its input features: GEMM + reduce-scatter)."""

    overlap: str = "ring"
    parallel: str = "column"

    def __post_init__(self):
        check_overlap(self.overlap)
        if self.parallel not in PARALLEL:
            raise ValueError(
                f"collective_gemm: parallel must be one of {PARALLEL}, not {self.parallel!r}"
            )


def check_overlap(overlap) -> str:
    """`overlap` if it names an overlap mode, else ValueError listing them."""
    if overlap not in OVERLAPS:
        raise ValueError(
            f"collective_gemm: overlap must be one of {tuple(OVERLAPS)}, not {overlap!r}"
        )
    return overlap


def of(value, parallel: str) -> CollectiveGemm | None:
    """A layer's CollectiveGemm from what users pass: None, an overlap name (then `parallel`
    is the layer's role) or a CollectiveGemm."""
    if value is None or isinstance(value, CollectiveGemm):
        return value
    return CollectiveGemm(check_overlap(value), parallel)


def check_recipe(ring, recipe) -> None:
    """Raises for a recipe the rings cannot take (block-scaled or MXFP8 operands)."""
    from qmesh.jax.recipe import Float8BlockScaling, MXFP8BlockScaling

    if ring is not None and isinstance(recipe, (Float8BlockScaling, MXFP8BlockScaling)):
        name = type(recipe).__name__
        raise NotImplementedError(
            "collective_gemm: the rings take per-tensor FP8 (DelayedScaling, "
            f"Float8CurrentScaling) or plain operands, not {name}'s block-scaled ones; use "
            f"collective_gemm=None with {name}"
        )


def check_quantized(ring, recipe) -> None:
    """Raises when the rings are asked for without an FP8 recipe (the layer would run XLA's
    high-precision path, not the rings)."""
    if ring is not None and recipe is None:
        raise ValueError(
            "collective_gemm: the rings run the FP8 layers; under autocast(enabled=False) the "
            "layer runs in high precision with XLA's collectives: pass collective_gemm=None "
            "there, or give the layer a recipe"
        )


def _coords(mesh, axis):
    """int32 [2]: this device's group (its index over the other axes) and rank on `axis`."""
    group = jnp.int32(0)
    for name in mesh.axis_names:
        if name != axis:
            group = group * mesh.shape[name] + lax.axis_index(name)
    return jnp.stack([group, lax.axis_index(axis)]).astype(jnp.int32)


def _scale(s):
    return jnp.ones((1,), F32) if s is None else jnp.reshape(s, (1,)).astype(F32)


def _call(target, results, operands, options):
    """The FFI call of one ring: operands (a, b, a_scale_inv, b_scale_inv), options (axis,
    overlap, split_accumulator, timeout_s)."""
    a, b, a_scale_inv, b_scale_inv = operands
    axis, overlap, split, timeout_s = options
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or axis not in mesh.axis_names:
        raise ValueError(
            f"collective_gemm: call {target} inside a shard_map over a mesh with the axis "
            f"{axis!r} (jax.shard_map over every axis of the mesh)"
        )
    if jax.default_backend() != "cpu":
        raise NotImplementedError(
            "collective_gemm: the rings from JAX run on CPU devices; their GPU handlers are "
            "not done (NCCL communicators are: comm_registry.communicator): use "
            "collective_gemm=None on GPUs"
        )
    comm = communicator(mesh, axis, timeout_s)
    call = jax.ffi.ffi_call(target, results)
    return call(
        a,
        b,
        _scale(a_scale_inv),
        _scale(b_scale_inv),
        _coords(mesh, axis),
        comm=np.int64(comm),
        overlap=np.int32(OVERLAPS[check_overlap(overlap)]),
        trans_b=True,
        split_accumulator=bool(split),
    )


def _check_operands(name, a, b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{name}: a must be [rows, K] and b [N, K] (the TN form) with the same K, got a "
            f"{tuple(a.shape)} and b {tuple(b.shape)}"
        )


def all_gather_gemm(
    a,
    b,
    a_scale_inv=None,
    b_scale_inv=None,
    *,
    axis,
    overlap="ring",
    split_accumulator=False,
    timeout_s=None,
):
    """(d, gathered): d float32 [tp * T, N] = gather(a) @ b.T, gathered [tp * T, K] = the
    chunks a of the tp devices of `axis`, in rank order. Per device, inside a shard_map over
    every mesh axis. a: [T, K], b: [N, K], both FP8 with their float32 scalar scale_inv (every
    device's a_scale_inv the same: an amax reduced over the axis) or both one plain dtype.
    overlap: "none", "ring" or "bidir"; split_accumulator: as gemm(); timeout_s: as
    communicator()."""
    _check_operands("all_gather_gemm", a, b)
    tp = jax.sharding.get_abstract_mesh().shape.get(axis, 1)
    results = (
        jax.ShapeDtypeStruct((tp * a.shape[0], b.shape[0]), F32),
        jax.ShapeDtypeStruct((tp * a.shape[0], a.shape[1]), a.dtype),
        jax.ShapeDtypeStruct((3,), F32),
    )
    options = (axis, overlap, split_accumulator, timeout_s)
    d, gathered, _ = _call(
        "qmesh_all_gather_gemm", results, (a, b, a_scale_inv, b_scale_inv), options
    )
    return d, gathered


def gemm_reduce_scatter(
    a,
    b,
    a_scale_inv=None,
    b_scale_inv=None,
    *,
    axis,
    overlap="ring",
    split_accumulator=False,
    timeout_s=None,
):
    """d float32 [T / tp, N]: this device's chunk (rank order on `axis`) of the sum over the
    devices of `axis` of a @ b.T. Per device, inside a shard_map over every mesh axis. a:
    [T, K] (T divisible by tp), b: [N, K], operands as all_gather_gemm's."""
    _check_operands("gemm_reduce_scatter", a, b)
    tp = jax.sharding.get_abstract_mesh().shape.get(axis, 1)
    if a.shape[0] % tp:
        raise ValueError(
            f"gemm_reduce_scatter: the {a.shape[0]} rows of a do not split into {tp} chunks "
            f"(the size of axis {axis!r}); pad the sequence to a multiple of {tp}"
        )
    results = jax.ShapeDtypeStruct((a.shape[0] // tp, b.shape[0]), F32)
    options = (axis, overlap, split_accumulator, timeout_s)
    return _call("qmesh_gemm_reduce_scatter", results, (a, b, a_scale_inv, b_scale_inv), options)


@dataclasses.dataclass(frozen=True)
class _Layout:
    mesh: object
    axis: str
    rows: P  # token rows sharded over the batch axes and the axis (sequence shards)
    whole: P  # token rows sharded over the batch axes only (every token of the sequence)


def _layout(m: int) -> _Layout:
    """The mesh in context and the layer's token layout for m rows (ValueError when the
    sequence shards do not divide m, or when no mesh/axis is there)."""
    mesh = jax.sharding.get_abstract_mesh()
    resource = sharding.global_mesh_resource()
    axis = resource.tpsp_resource or resource.tp_resource
    if mesh.empty or axis is None or axis not in mesh.axis_names:
        raise ValueError(
            "collective_gemm needs a mesh in context (jax.set_mesh) and a MeshResource whose "
            "tpsp_resource (or tp_resource) names its sequence-parallel axis "
            "(qmesh.jax.global_shard_guard)"
        )
    batch = tuple(a for a in (resource.dp_resource,) if a in mesh.axis_names and a != axis)
    shards = math.prod(mesh.shape[a] for a in (*batch, axis))
    if m % shards:
        raise ValueError(
            f"collective_gemm: the {m} tokens (rows) do not split into {shards} sequence "
            f"shards ({' x '.join(f'{a}={mesh.shape[a]}' for a in (*batch, axis))}); pad the "
            f"sequence so that the tokens are a multiple of {shards}, or use "
            "collective_gemm=None"
        )
    whole = batch if len(batch) > 1 else (batch[0] if batch else None)
    return _Layout(mesh, axis, P((*batch, axis), None), P(whole, None))


def _shard_map(f, layout, in_specs, out_specs):
    return jax.shard_map(
        f, mesh=layout.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )


def forward(ring: CollectiveGemm, a, a_scale_inv, b, b_scale_inv):
    """(out float32 [M, N], kept [M, K]) of the forward GEMM a [M, K] @ b.T (b [N, K], the
    kernel's columnwise copy): column parallel gathers a's token shards (kept: the gathered
    codes, for the weight gradient), row parallel reduce-scatters the product to token shards
    (kept: a)."""
    lay = _layout(a.shape[0])
    axis, whole = lay.axis, lay.whole[0]
    scalar = P()
    if ring.parallel == "column":

        def body(a, s, b, t):
            return all_gather_gemm(a, b, s, t, axis=axis, overlap=ring.overlap)

        specs = (lay.rows, scalar, P(axis, None), scalar)
        out, kept = _shard_map(body, lay, specs, (P(whole, axis), lay.whole))(
            a, a_scale_inv, b, b_scale_inv
        )
        return out, kept

    def body(a, s, b, t):
        return gemm_reduce_scatter(a, b, s, t, axis=axis, overlap=ring.overlap)

    specs = (P(whole, axis), scalar, P(None, axis), scalar)
    out = _shard_map(body, lay, specs, lay.rows)(a, a_scale_inv, b, b_scale_inv)
    return out, a


def dgrad(ring: CollectiveGemm, g, g_scale_inv, w, w_scale_inv):
    """(dx float32 [M, K], g_rows [M, N]) of the input gradient g [M, N] @ w.T (w [K, N], the
    kernel's codes): column parallel reduce-scatters dx to token shards (g_rows: g), row
    parallel gathers g's token shards (g_rows: the gathered codes, for the weight
    gradient)."""
    lay = _layout(g.shape[0])
    axis, whole = lay.axis, lay.whole[0]
    scalar = P()
    if ring.parallel == "column":

        def body(g, s, w, t):
            return gemm_reduce_scatter(
                g, w, s, t, axis=axis, overlap=ring.overlap, split_accumulator=True
            )

        specs = (P(whole, axis), scalar, P(None, axis), scalar)
        return _shard_map(body, lay, specs, lay.rows)(g, g_scale_inv, w, w_scale_inv), g

    def body(g, s, w, t):
        return all_gather_gemm(g, w, s, t, axis=axis, overlap=ring.overlap, split_accumulator=True)

    specs = (lay.rows, scalar, P(axis, None), scalar)
    return _shard_map(body, lay, specs, (P(whole, axis), lay.whole))(g, g_scale_inv, w, w_scale_inv)
