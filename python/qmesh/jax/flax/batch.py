"""The batch dimensions of the drop-ins' GEMMs (quantized_dot_general: "ecd,edf->ecf", batch e),
with expert parallelism.

    map_batch(gemm, x, w, state)  # x [B, M, K], w [B, K, N] -> [B, M, N]

runs gemm(x[i], w[i], state) for every batch element i. qmesh's GEMM primitive is 2-D (the
handler calls one cuBLASLt / host GEMM); under jax.vmap its batching rule runs the primitives
in a loop (lax.map, primitive.py): the compiled HLO holds one GEMM call inside a while loop,
each element exact on its own (current and block scaling scale each element's operands on
their own; delayed scaling uses the one state, its amaxes combined by maximum: one scale for
all the batch's inputs, one for all its weights, as TransformerEngine keeps one per tensor).

A loop does not keep a sharding of the batch dimension: sharded, XLA gathers the whole of x
and w on every device before the loop. With expert parallelism (MeshResource.ep_resource, the
mesh in context: jax.set_mesh) the batch is split over that mesh axis instead: a jax.shard_map
manual over that axis only (the others stay Auto, so the primitives' own sharding rules apply
within) runs the loop on each device's own batch elements, so x, w and the result stay sharded
along B and nothing is gathered. The state goes to every device (delayed_state.share_state) and
the devices' state gradients combine by maximum, as the unsharded loop's. B must be a multiple
of the axis' size.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from qmesh.jax.delayed_state import share_state
from qmesh.jax.sharding import global_mesh_resource


def map_batch(gemm: Callable, x, w, state):
    """gemm(x[i], w[i], state) stacked over i (see the module docstring): x [B, ...], w [B, ...],
    state a tree (None: no state) that every element uses."""

    def loop(x, w, state):
        return jax.vmap(gemm, in_axes=(0, 0, None))(x, w, state)

    axis = global_mesh_resource().ep_resource
    if axis is None:
        return loop(x, w, state)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or axis not in mesh.axis_names:
        raise ValueError(
            f"MeshResource.ep_resource is {axis!r}: the batched GEMM needs the mesh in context "
            f"(with jax.set_mesh(mesh): ...) and the mesh an axis {axis!r}"
            + ("" if mesh.empty else f", not only {tuple(mesh.axis_names)}")
        )
    if dict(zip(mesh.axis_names, mesh.axis_types))[axis] != AxisType.Auto:
        return loop(x, w, state)  # already per device (inside a shard_map over the axis)
    n = mesh.shape[axis]
    if x.shape[0] % n:
        raise ValueError(
            f"expert parallelism: the batch dimension ({x.shape[0]}) is not a multiple of the "
            f"size of the mesh axis {axis!r} (MeshResource.ep_resource), {n}"
        )

    def local(x, w, states):  # one device's batch elements, its copy of the state
        return loop(x, w, jax.tree.map(lambda a: a[0], states))

    states = share_state(state, n) if state is not None else None
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(P(axis), P(axis), P(axis)),
        out_specs=P(axis),
        axis_names=frozenset({axis}),
        check_vma=False,  # qmesh's primitives do not type their results' manual axes
    )(x, w, states)
