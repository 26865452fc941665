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
  operand (the FP8 codes the ring gathered), as the C++ layers do. Float8BlockScaling: the
  token operands travel in 1x128 blocks with their scale tensors, the kernel in 128x128
  tiles; the weight gradient's columnwise copy of a sequence-sharded token operand is cast
  from its all-gathered high-precision rows (gather_rows), as the C++ Dense does.
- The shortcut: autocast(collective_gemm=...) sets the overlap of the layers given none
  (in_force).
- Ring primitives for shard_map users: `all_gather_gemm` and `gemm_reduce_scatter`, called
  per device inside a shard_map over every axis of the mesh.

Communicators (comm_registry.py): one world per index combination of the other mesh axes,
made once per (mesh, axis) by `communicator` and reused: the local backend when the axis lies
inside each process (the CPU devices of a process run on threads of their own), UCX when it
spans processes, NCCL on GPUs. Every wait is bounded by the communicator's timeout
(QMESH_COMM_TIMEOUT_S, or timeout_s of `communicator`): a device that never reaches the ring
makes the call fail with a timeout error, not hang.

Bits: the three overlap modes give the same bits (the C++ contract): every mode runs the same
per-chunk GEMMs and sums the partials in the same ring order. They are not the bits of XLA's
all-gather then one full GEMM (collective_gemm=None): the host GEMM's rows depend on the
number of rows M (docs/design/overlap.md), and XLA's reduce-scatter sums in its own order;
"none" (the rings' unoverlapped schedule through the same handlers) is the bitwise reference,
and collective_gemm=None agrees within the GEMM's rounding (docs/jax.md).

Several processes (jax.distributed on the CPU) work with the axis inside each process or
across processes (UCX; run the step under jax.set_mesh(mesh), which names the devices).

On CUDA GPUs the rings run on NCCL communicators (one rank per GPU; run the step under
jax.set_mesh(mesh)): GEMMs on XLA's stream, transfers on a stream of the rank's, no host wait
(docs/jax.md "Collective GEMMs on GPUs").

Refused: a token count that the batch axes times the axis do not divide (ValueError; pad the
sequence), MXFP8 / NVFP4 and token operands in 128x128 tiles (check_recipe), block-scaled
features that split into partial 128-blocks, accelerators other than CUDA GPUs.
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
from qmesh.jax.autocast import current as autocast_setting
from qmesh.jax.block_quantize import BLOCK, from_layout, layout_shape, to_layout
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
    """A layer's CollectiveGemm from what users pass: None or False (passed through), an
    overlap name (then `parallel` is the layer's role) or a CollectiveGemm."""
    if value is None or value is False or isinstance(value, CollectiveGemm):
        return value
    return CollectiveGemm(check_overlap(value), parallel)


def in_force(value, recipe):
    """What a layer given collective_gemm=`value` runs with `recipe`: `value` when given
    (False: XLA's collectives, None returned); else, for an FP8 layer (recipe not None), the
    overlap of the innermost autocast(collective_gemm=...); else None."""
    if value is not None:
        return None if value is False else value
    setting = autocast_setting()
    return None if recipe is None or setting is None else setting.collective_gemm


def check_recipe(ring, recipe) -> None:
    """Raises NotImplementedError for a recipe whose operands the rings cannot take: the rings
    take per-tensor FP8 (DelayedScaling, Float8CurrentScaling), plain operands, and
    Float8BlockScaling with the token operands (x, the output gradient) in 1x128 blocks (a
    chunk of token rows would cut 128x128 tiles); not MXFP8 or NVFP4 (1x32 / 1x16 scales
    along K, no ring takes them)."""
    from qmesh.jax.recipe import DelayedScaling, Float8BlockScaling, Float8CurrentScaling

    if ring is None or recipe is None or isinstance(recipe, (DelayedScaling, Float8CurrentScaling)):
        return
    name = type(recipe).__name__
    if not isinstance(recipe, Float8BlockScaling):
        raise NotImplementedError(
            "collective_gemm: the rings take per-tensor FP8 (DelayedScaling, "
            "Float8CurrentScaling), Float8BlockScaling or plain operands, not "
            f"{name}'s microscaled ones; use collective_gemm=None with {name}"
        )
    if recipe.x_block_scaling_dim != 1 or recipe.grad_block_scaling_dim != 1:
        raise NotImplementedError(
            "collective_gemm: the rings take the token operands (x, the output gradient) in "
            "1x128 blocks (a chunk of token rows would cut 128x128 tiles): set "
            "x_block_scaling_dim=1 and grad_block_scaling_dim=1, or use collective_gemm=None"
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


def _scale(s, block):
    """The handler's operand for a scale_inv: the scalar as float32 [1], a block scale tensor
    in the C++ layout."""
    if block:
        return to_layout(s, block)
    return jnp.ones((1,), F32) if s is None else jnp.reshape(s, (1,)).astype(F32)


def _check_blocks(a_block, b_block, a_scale_inv, b_scale_inv):
    if (a_block, b_block) == (0, 0):
        return
    if a_block != 1 or b_block not in (1, 2):
        raise ValueError(
            "collective_gemm: a block-scaled ring takes a in 1x128 blocks (a_block=1; a chunk "
            "of rows would cut 128x128 tiles) and b in 1x128 blocks or 128x128 tiles (b_block "
            f"1 or 2), got a_block={a_block}, b_block={b_block}"
        )
    if a_scale_inv is None or b_scale_inv is None:
        raise ValueError("collective_gemm: block-scaled operands need their scale tensors")


def _call(target, results, operands, options):
    """The FFI call of one ring: operands (a, b, a_scale_inv, b_scale_inv), options (axis,
    overlap, split_accumulator, timeout_s, a_block, b_block)."""
    a, b, a_scale_inv, b_scale_inv = operands
    axis, overlap, split, timeout_s, a_block, b_block = options
    _check_blocks(a_block, b_block, a_scale_inv, b_scale_inv)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or axis not in mesh.axis_names:
        raise ValueError(
            f"collective_gemm: call {target} inside a shard_map over a mesh with the axis "
            f"{axis!r} (jax.shard_map over every axis of the mesh)"
        )
    if jax.default_backend() not in ("cpu", "gpu"):
        raise NotImplementedError(
            "collective_gemm: the rings from JAX run on CPU devices and on CUDA GPUs (NCCL), "
            f"not on {jax.default_backend()!r}: use collective_gemm=None there"
        )
    comm = communicator(mesh, axis, timeout_s)
    call = jax.ffi.ffi_call(target, results)
    return call(
        a,
        b,
        _scale(a_scale_inv, a_block),
        _scale(b_scale_inv, b_block),
        _coords(mesh, axis),
        comm=np.int64(comm),
        overlap=np.int32(OVERLAPS[check_overlap(overlap)]),
        trans_b=True,
        split_accumulator=bool(split),
        a_block=np.int32(a_block),
        b_block=np.int32(b_block),
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
    a_block=0,
    b_block=0,
):
    """(d, gathered): d float32 [tp * T, N] = gather(a) @ b.T, gathered [tp * T, K] = the
    chunks a of the tp devices of `axis`, in rank order. Per device, inside a shard_map over
    every mesh axis. a: [T, K], b: [N, K], both FP8 with their float32 scalar scale_inv (every
    device's a_scale_inv the same: an amax reduced over the axis) or both one plain dtype; or
    block-scaled (a_block=1: a in 1x128 blocks; b_block 1 or 2) with their scale tensors in
    block_quantize's shapes ([T, ceil(K/128)] for a): then (d, gathered, gathered_scale_inv
    [tp * T, ceil(K/128)]), gathered and its scales bitwise the block cast of the gathered
    input. overlap: "none", "ring" or "bidir"; split_accumulator: as gemm(); timeout_s: as
    communicator()."""
    _check_operands("all_gather_gemm", a, b)
    tp = jax.sharding.get_abstract_mesh().shape.get(axis, 1)
    rows = tp * a.shape[0]
    scales = layout_shape(rows, a.shape[1], a_block) if a_block else (3,)
    results = (
        jax.ShapeDtypeStruct((rows, b.shape[0]), F32),
        jax.ShapeDtypeStruct((rows, a.shape[1]), a.dtype),
        jax.ShapeDtypeStruct(scales, F32),
    )
    options = (axis, overlap, split_accumulator, timeout_s, a_block, b_block)
    d, gathered, gathered_scales = _call(
        "qmesh_all_gather_gemm", results, (a, b, a_scale_inv, b_scale_inv), options
    )
    if a_block:
        return d, gathered, from_layout(gathered_scales, gathered.shape, a_block)
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
    a_block=0,
    b_block=0,
):
    """d float32 [T / tp, N]: this device's chunk (rank order on `axis`) of the sum over the
    devices of `axis` of a @ b.T. Per device, inside a shard_map over every mesh axis. a:
    [T, K] (T divisible by tp), b: [N, K], operands (and a_block, b_block) as
    all_gather_gemm's."""
    _check_operands("gemm_reduce_scatter", a, b)
    tp = jax.sharding.get_abstract_mesh().shape.get(axis, 1)
    if a.shape[0] % tp:
        raise ValueError(
            f"gemm_reduce_scatter: the {a.shape[0]} rows of a do not split into {tp} chunks "
            f"(the size of axis {axis!r}); pad the sequence to a multiple of {tp}"
        )
    results = jax.ShapeDtypeStruct((a.shape[0] // tp, b.shape[0]), F32)
    options = (axis, overlap, split_accumulator, timeout_s, a_block, b_block)
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


def gather_rows(x):
    """x [M, C] with its token rows (sequence shards over the layer's axis) all-gathered over
    the axis: rows sharded over the batch axes only. Under Float8BlockScaling the columnwise
    copy of a sequence-sharded token operand is cast from these rows (its 128-blocks run along
    the tokens, across the shards), as the C++ Dense gathers the high-precision shard."""
    lay = _layout(x.shape[0])

    def body(x):
        return lax.all_gather(x, lay.axis, axis=0, tiled=True)

    return _shard_map(body, lay, (lay.rows,), lay.whole)(x)


def _operand_specs(a_spec, b_spec, a_block, b_block):
    """The in_specs of (a, a_scale_inv, b, b_scale_inv): a scalar scale_inv is replicated, a
    block scale tensor is sharded as its operand (its rows and blocks follow the data's)."""
    return a_spec, a_spec if a_block else P(), b_spec, b_spec if b_block else P()


def _check_tiles(ring, n, lay, b_block):
    """Raises unless the n features that the axis splits keep whole 128-blocks per device
    (block-scaled operands: a shard boundary must not cut a block)."""
    tp = lay.mesh.shape[lay.axis]
    if b_block and (n % tp or (n // tp) % BLOCK):
        raise ValueError(
            f"collective_gemm ({ring.parallel} parallel) with block-scaled operands: the {n} "
            f"features that axis {lay.axis!r} splits into {tp} shards must give shards of "
            f"whole {BLOCK}-blocks (a multiple of {BLOCK * tp}); resize the layer or use "
            "collective_gemm=None"
        )


def forward(ring: CollectiveGemm, a, a_scale_inv, b, b_scale_inv, a_block=0, b_block=0):
    """(out float32 [M, N], kept [M, K]) of the forward GEMM a [M, K] @ b.T (b [N, K], the
    kernel's columnwise copy): column parallel gathers a's token shards (kept: the gathered
    codes, for the weight gradient), row parallel reduce-scatters the product to token shards
    (kept: a). a_block, b_block: as all_gather_gemm's (block scale tensors in block_quantize's
    shapes; kept is then the gathered codes without their scales)."""
    lay = _layout(a.shape[0])
    axis, whole = lay.axis, lay.whole[0]
    blocks = dict(axis=axis, overlap=ring.overlap, a_block=a_block, b_block=b_block)
    if ring.parallel == "column":
        _check_tiles(ring, b.shape[0], lay, b_block)

        def body(a, s, b, t):
            return all_gather_gemm(a, b, s, t, **blocks)[:2]

        specs = _operand_specs(lay.rows, P(axis, None), a_block, b_block)
        out, kept = _shard_map(body, lay, specs, (P(whole, axis), lay.whole))(
            a, a_scale_inv, b, b_scale_inv
        )
        return out, kept

    _check_tiles(ring, b.shape[1], lay, b_block)

    def body(a, s, b, t):
        return gemm_reduce_scatter(a, b, s, t, **blocks)

    specs = _operand_specs(P(whole, axis), P(None, axis), a_block, b_block)
    out = _shard_map(body, lay, specs, lay.rows)(a, a_scale_inv, b, b_scale_inv)
    return out, a


def dgrad(ring: CollectiveGemm, g, g_scale_inv, w, w_scale_inv, a_block=0, b_block=0):
    """(dx float32 [M, K], g_rows [M, N]) of the input gradient g [M, N] @ w.T (w [K, N], the
    kernel's codes): column parallel reduce-scatters dx to token shards (g_rows: g), row
    parallel gathers g's token shards (g_rows: the gathered codes, for the weight
    gradient). a_block, b_block: g's and w's blocks, as forward()."""
    lay = _layout(g.shape[0])
    axis, whole = lay.axis, lay.whole[0]
    blocks = dict(axis=axis, overlap=ring.overlap, a_block=a_block, b_block=b_block)
    if ring.parallel == "column":
        _check_tiles(ring, w.shape[1], lay, b_block)

        def body(g, s, w, t):
            return gemm_reduce_scatter(g, w, s, t, split_accumulator=True, **blocks)

        specs = _operand_specs(P(whole, axis), P(None, axis), a_block, b_block)
        return _shard_map(body, lay, specs, lay.rows)(g, g_scale_inv, w, w_scale_inv), g

    _check_tiles(ring, w.shape[0], lay, b_block)

    def body(g, s, w, t):
        return all_gather_gemm(g, w, s, t, split_accumulator=True, **blocks)[:2]

    specs = _operand_specs(lay.rows, P(axis, None), a_block, b_block)
    return _shard_map(body, lay, specs, (P(whole, axis), lay.whole))(g, g_scale_inv, w, w_scale_inv)
