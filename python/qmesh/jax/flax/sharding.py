"""The sharding policy of qmesh's Flax modules: the logical axis rules of their parameters,
the activation specs (TransformerEngine's logical axes mapped by the same rules) and the
token layout of sequence parallelism. See module.py's docstring for what each module
constrains."""

from __future__ import annotations

import math

import flax.linen as nn
import jax

from qmesh.jax.common import axes_of, entry
from qmesh.jax.sharding import MeshResource, check_mesh_resource, constrain, global_mesh_resource

# TransformerEngine's activation layout for [batch, seq, hidden] inputs (logical axes).
SEQ_AXES = ("batch", "seq", "embed")
DOT_1_INPUT_AXES = ("batch", None, "embed")
HIDDEN_AXES = ("batch", None, "mlp")


def logical_axis_rules(resource: MeshResource | None = None) -> tuple:
    """Flax logical axis rules for the modules' parameter axes under `resource` (default: the
    MeshResource of the current global_shard_guard)."""
    r = resource or global_mesh_resource()
    tp = r.tp_resource
    return (
        ("batch", r.dp_resource),
        ("embed", None),
        ("act", None),
        ("mlp", tp),
        ("heads", tp),
        ("joined_kv", tp),
        ("kv", None),
        ("seq", r.tpsp_resource),
    )


def logical_param(module: nn.Module, name: str, init, shape: tuple, dtype, axes: tuple):
    """module.param(name, ...), partitioned by its logical axes (one per dimension; () for
    none)."""
    if axes:
        if len(axes) != len(shape):
            raise ValueError(
                f"{name}: {len(axes)} logical axes {axes} for a {len(shape)}-D parameter "
                f"of shape {shape}"
            )
        init = nn.with_logical_partitioning(init, axes)
    return module.param(name, init, shape, dtype)


def check_divisible(size: int, axes: tuple, what: str) -> None:
    """Raises ValueError when a parameter dimension mapped to the tp axis does not divide."""
    mesh = jax.sharding.get_abstract_mesh()
    tp = global_mesh_resource().tp_resource
    if mesh.empty or tp is None or tp not in mesh.axis_names:
        return
    if any(a in ("mlp", "heads", "joined_kv") for a in axes) and size % mesh.shape[tp]:
        raise ValueError(
            f"{what} = {size} is not divisible by the tensor-parallel size "
            f"{mesh.shape[tp]} (mesh axis {tp!r})"
        )


def activation_spec(axes, default: tuple, ndim: int, what: str):
    """The mesh axes (one entry per dimension) an activation is constrained to, or None for
    no constraint. `axes` None means `default` for an activation of its rank (none otherwise);
    () means no constraint. Nothing is constrained unless the MeshResource in force names tp
    or tpsp."""
    resource = global_mesh_resource()
    if resource.tp_resource is None and resource.tpsp_resource is None:
        return None
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or any(t != jax.sharding.AxisType.Auto for t in mesh.axis_types):
        return None  # no mesh in context, or inside shard_map: nothing to constrain
    check_mesh_resource(mesh, resource)
    if axes is None:
        if ndim != len(default):
            return None
        axes = default
    axes = tuple(axes)
    if not axes:
        return None
    if len(axes) != ndim:
        raise ValueError(f"{what}: {len(axes)} logical axes {axes} for a {ndim}-D activation")
    return tuple(nn.logical_to_mesh_axes(axes, logical_axis_rules(resource)))


def constrain_activation(x, spec):
    """x constrained to the activation spec `spec` (None: x as it is)."""
    return x if spec is None else constrain(x, spec)


def token_layout(inputs, seq, *specs, in_spec=()):
    """(x, (seq, *specs), leave): the input in the layout the module computes in, the
    activation specs for that layout, and the function that takes a result back to the
    input's layout. The input is constrained to in_spec (default: seq).

    Sequence parallel ([batch, seq, ...] activations whose seq dimension seq shards): the
    tokens are flattened in the order (batch shard, seq, batch within the shard), so that the
    2-D token dimension is sharded over the batch axes and then the seq axes in contiguous
    blocks: the layout in which gathering the seq axes gives each device its batch shard's
    rows, and the row-parallel GEMM's reduce-scatter along rows (gemm.py) gives back exactly
    the sequence shards. Going in and out only reshapes and transposes locally. Otherwise x is
    the (constrained) input and leave is the identity."""
    in_spec = seq if in_spec == () else in_spec
    if seq is None or inputs.ndim < 3 or seq[1] is None:
        return constrain_activation(inputs, in_spec), (seq, *specs), lambda y: y
    mesh = jax.sharding.get_abstract_mesh()
    size = lambda e: math.prod(mesh.shape[a] for a in axes_of(e))  # noqa: E731
    b, n = inputs.shape[:2]
    g = size(seq[0])
    if b % g or n % size(seq[1]):
        raise ValueError(
            f"sequence parallelism: the batch ({b}) must be divisible by {g} "
            f"(mesh axes {seq[0]!r}) and the sequence ({n}) by {size(seq[1])} "
            f"(mesh axes {seq[1]!r})"
        )

    def tokens(spec):
        return (
            None
            if spec is None
            else (entry(tuple(a for e in spec[:2] for a in axes_of(e))), *spec[2:])
        )

    def leave(y):
        y = y.reshape(g, n, b // g, *y.shape[1:]).swapaxes(1, 2)
        return y.reshape(b, n, *y.shape[3:])

    rest = inputs.shape[2:]
    x = constrain_activation(inputs, in_spec).reshape(g, b // g, n, *rest).swapaxes(1, 2)
    x = x.reshape(b * n, *rest)
    return x, tuple(tokens(sp) for sp in (seq, *specs)), leave


def rows_of(spec) -> tuple | None:
    """The mesh axes of the rows (every dimension but the last) of an activation spec."""
    if spec is None:
        return None
    return tuple(a for e in spec[:-1] for a in axes_of(e))
