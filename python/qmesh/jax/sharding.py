"""Which mesh axis plays which role, for the sharding rules of qmesh's primitives.

    with jax.sharding.use_mesh(mesh), global_shard_guard(MeshResource(dp_resource="dp",
                                                                      tp_resource="tp")):
        ...

The names follow TransformerEngine's JAX extension. Without a guard every mesh axis is a
plain axis: amaxes are reduced over all of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import jax
from jax import lax
from jax.sharding import AxisType, PartitionSpec


@dataclasses.dataclass(frozen=True)
class MeshResource:
    """The mesh axis name of each parallelism role (None: the role is not used)."""

    dp_resource: str | None = None
    tp_resource: str | None = None
    tpsp_resource: str | None = None
    fsdp_resource: str | None = None
    pp_resource: str | None = None
    ep_resource: str | None = None  # experts: the leading batch index of the drop-ins' GEMMs

    def axes(self) -> dict[str, str]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


_state = threading.local()
# The MeshResource is read when a function is traced; as a JAX user context it is also part of
# jax.jit's cache key, so a function traced under one guard is traced again under another
# (with a JAX that lacks jax.make_user_context, a jitted function keeps the MeshResource of
# its first trace).
_make_user_context = getattr(jax, "make_user_context", None)
_jit_key = _make_user_context(None) if _make_user_context else None


def global_mesh_resource() -> MeshResource:
    """The MeshResource of the innermost global_shard_guard (an empty one outside)."""
    return getattr(_state, "resource", None) or MeshResource()


@contextlib.contextmanager
def global_shard_guard(resource: MeshResource):
    """Makes `resource` the MeshResource of qmesh's sharding rules inside the block."""
    if not isinstance(resource, MeshResource):
        raise TypeError(
            f"global_shard_guard takes a qmesh.jax.MeshResource, not {type(resource).__name__}"
        )
    previous = getattr(_state, "resource", None)
    _state.resource = resource
    try:
        if _jit_key is None:
            yield resource
        else:
            with _jit_key(resource):
                yield resource
    finally:
        _state.resource = previous


def check_mesh_resource(mesh, resource: MeshResource | None = None) -> None:
    """Raises ValueError if `resource` names an axis that `mesh` lacks (a mesh without axes,
    arguments on one device, shards nothing and passes)."""
    resource = resource or global_mesh_resource()
    if not tuple(mesh.axis_names):
        return
    for role, axis in resource.axes().items():
        if axis not in mesh.axis_names:
            raise ValueError(
                f"MeshResource.{role} is {axis!r}, but the mesh has only the axes "
                f"{tuple(mesh.axis_names)}: name one of them (or None) in the "
                "MeshResource of global_shard_guard"
            )


def check_resource_for(*args) -> None:
    """Raises ValueError, before anything is traced further, if the MeshResource in force
    names an axis that the mesh of the context or of an argument lacks."""
    resource = global_mesh_resource()
    if not resource.axes():
        return
    meshes = [jax.sharding.get_abstract_mesh()]
    meshes += [getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None) for x in args]
    for mesh in meshes:
        if mesh is not None and not mesh.empty:
            check_mesh_resource(mesh, resource)


def amax_axes(mesh) -> tuple[str, ...]:
    """The axes an amax is reduced over: every axis of `mesh` except the pipeline axis."""
    resource = global_mesh_resource()
    check_mesh_resource(mesh, resource)
    return tuple(a for a in mesh.axis_names if a != resource.pp_resource)


def check_auto_axes(*args) -> None:
    """Raises ValueError for an argument sharded over a mesh with Explicit axes: qmesh's
    partitioning callbacks work with Auto axes (the result would come back unsharded)."""
    for x in args:
        sharding = getattr(jax.typeof(x), "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        types = getattr(mesh, "axis_types", ()) or ()
        if any(t == AxisType.Explicit for t in types):
            raise ValueError(
                "qmesh primitives need a mesh whose axes are Auto: make it with "
                "jax.make_mesh(shape, names, "
                "axis_types=(jax.sharding.AxisType.Auto,) * len(names)) "
                f"(this argument is typed on a mesh with axis types {tuple(types)})"
            )


def constrain(x, spec):
    """x with the sharding constraint PartitionSpec(*spec) on the mesh of the context
    (jax.set_mesh / use_mesh); entries may be PartitionSpec.UNCONSTRAINED. Returns x unchanged
    when there is no mesh in context, when the mesh lacks one of the named axes, or when one of
    them is not Auto (inside shard_map, or an Explicit mesh): single-device and shard_map code
    is not affected."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    named = [
        a
        for e in spec
        if e is not None and e is not PartitionSpec.UNCONSTRAINED
        for a in (e if isinstance(e, tuple) else (e,))
    ]
    if any(types.get(a) != AxisType.Auto for a in named):
        return x
    if not isinstance(x, jax.core.Tracer):  # eager: place the array on the concrete mesh
        try:
            mesh = jax.sharding.get_mesh()
        except ValueError:  # a constant inside jit: it keeps the sharding it has
            return x
        if mesh.empty:
            return x
        spec = [None if e is PartitionSpec.UNCONSTRAINED else e for e in spec]
        return jax.device_put(x, jax.sharding.NamedSharding(mesh, PartitionSpec(*spec)))
    return lax.with_sharding_constraint(x, PartitionSpec(*spec))
