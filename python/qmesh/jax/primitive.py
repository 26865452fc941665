"""The base of qmesh's JAX primitives.

Each op is two JAX primitives, as TransformerEngine's JAX extension builds them:

- the *inner* primitive `<name>_ffi` lowers to qmesh's XLA FFI handler (`<target>`): it is what
  one device runs;
- the *outer* primitive `<name>` is what users bind: its lowering is a
  `jax.experimental.custom_partitioning` function (a Shardy `sharding_rule`, and the GSPMD
  callbacks) whose partitioned body runs the inner primitive on each device's shard plus the
  collectives the op needs (an amax `pmax`, a partial-sum `psum`); it also has the batching rule
  (`vmap`), which custom_partitioning lacks.

An op is a subclass of `Op` registered with `@register`; see quantize.py for examples.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import dispatch
from jax._src.dispatch import apply_primitive
from jax._src.sharding_impls import ShardingContext
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from qmesh.jax import _ffi, sharding
from qmesh.jax.common import named


class Op:
    """One qmesh op. Subclasses set the class attributes and override what they need."""

    name: str = ""  # the outer primitive's name
    target: str = ""  # the FFI target (qmesh_<...>, see _ffi.HANDLERS)
    num_inputs: int = 0
    static_params: tuple[str, ...] = ()  # keyword parameters, in a fixed order (hashable values)
    output_aliases: dict[int, int] = {}  # input index -> output index that may reuse its buffer
    # output index -> the input indices it is a function of alone (a quantize's scale_inv of
    # its scale): under vmap such an output of unbatched inputs stays unbatched.
    unbatched_outputs: dict[int, tuple[int, ...]] = {}

    @classmethod
    def abstract(cls, *avals, **params):
        """The outputs' ShapedArrays (also where bad shapes and dtypes raise)."""
        raise NotImplementedError(cls.name)

    @classmethod
    def inner_abstract(cls, *avals, **params):
        """The inner primitive's outputs, where the handler's differ from what users see
        (`local` converts). Default: `abstract`."""
        return cls.abstract(*avals, **params)

    @classmethod
    def attributes(cls, **params) -> dict:
        """The FFI attributes (numpy-typed scalars: np.int32, np.float32, bool)."""
        return {}

    @classmethod
    def is_empty(cls, *avals, **params) -> bool:
        """Whether the call has no data for the handler (then `empty` computes it in JAX)."""
        return any(a.size == 0 for a in avals)

    @classmethod
    def empty(cls, *args, **params):
        """The inner primitive's outputs for inputs with no elements, in plain JAX."""
        raise NotImplementedError(cls.name)

    @classmethod
    def local(cls, plan, *args, **params):
        """What one device computes on its shards. `plan` is the third item `shardings`
        returned (the mesh axes to reduce over, ...), or None when the op is not partitioned.
        Default: the inner primitive."""
        return cls.inner.bind(*args, **params)

    @classmethod
    def batch(cls, args, dims, **params):
        """The batching rule (jax.vmap): (outputs, their batch dimensions). Default: a loop over
        the batch (batch_by_map)."""
        return batch_by_map(cls, args, dims, **params)

    @classmethod
    def shardings(cls, mesh, arg_infos, **params):
        """(argument shardings, result shardings, plan for `local`) for the shardings the
        arguments arrive with. Default: everything replicated, plan None."""
        replicated = named(mesh)
        outs = cls.abstract(*[jax.core.ShapedArray(a.shape, a.dtype) for a in arg_infos], **params)
        return [replicated] * len(arg_infos), [replicated] * len(outs), None

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        """The Shardy rule: an einsum-like string, or (string, factor sizes)."""
        raise NotImplementedError(cls.name)

    @classmethod
    def mesh_sharding_rule(cls, mesh, value_types, result_types, **params):
        """The Shardy rule for a rule that depends on the mesh's axis sizes. Default:
        sharding_rule."""
        return cls.sharding_rule(value_types, result_types, **params)

    # Set by register():
    inner: Primitive
    outer: Primitive

    @classmethod
    def bind(cls, *args, **params):
        """Binds the outer primitive. The MeshResource in force is recorded with the call (a
        static parameter): XLA may run the partitioning callbacks on another thread."""
        sharding.check_auto_axes(*args)
        sharding.check_resource_for(*args)
        return cls.outer.bind(*args, **params, resource=sharding.global_mesh_resource())


_threads_capped = False


def _lower_inner(op, ctx, *args, **params):
    global _threads_capped
    if not _threads_capped:  # the devices exist by now (never at import: see _ffi)
        _ffi.cap_cpu_threads()
        _threads_capped = True
    if op.is_empty(*ctx.avals_in, **params):
        return mlir.lower_fun(functools.partial(op.empty, **params), multiple_results=True)(
            ctx, *args
        )
    lowering = jax.ffi.ffi_lowering(op.target, operand_output_aliases=dict(op.output_aliases))
    return lowering(ctx, *args, **op.attributes(**params))


def batch_by_map(op, args, dims, **params):
    """vmap by a loop over the batch (lax.map): every op stays exact per batch element (each
    element has its own amax and scale). The op's unbatched_outputs of unbatched inputs are
    equal in every element: element 0's, unbatched."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    mapped = [i for i, d in enumerate(dims) if d is not None]
    moved = [jnp.moveaxis(args[i], dims[i], 0) for i in mapped]

    def one(slices):
        full = list(args)
        for i, s in zip(mapped, slices):
            full[i] = s
        return tuple(op.outer.bind(*full, **params))  # params carry the recorded resource

    outs = lax.map(one, moved) if size else None
    if outs is None:  # an empty batch: shapes from the abstract evaluation
        avals = op.abstract(
            *[
                jax.core.ShapedArray(
                    jnp.moveaxis(a, d, 0).shape[1:] if d is not None else a.shape, a.dtype
                )
                for a, d in zip(args, dims)
            ],
            **{k: v for k, v in params.items() if k != "resource"},
        )
        outs = tuple(jnp.zeros((0,) + a.shape, a.dtype) for a in avals)
    out_dims = [0] * len(outs)
    for out, inputs in op.unbatched_outputs.items():
        if size and all(dims[i] is None for i in inputs):
            outs = outs[:out] + (outs[out][0],) + outs[out + 1 :]
            out_dims[out] = None
    return outs, tuple(out_dims)


def _single_device(axis_context) -> bool:
    """Whether a lowering targets one device (jit without a mesh): nothing to partition, and
    custom_partitioning refuses a context without a device assignment."""
    if isinstance(axis_context, ShardingContext):
        return axis_context.num_devices == 1 or axis_context.device_assignment is None
    return False


def register(op: type[Op]) -> type[Op]:
    """Creates and registers the inner and outer primitives of `op`."""
    n = op.num_inputs
    statics = op.static_params + ("resource",)

    def strip(params):
        return {k: v for k, v in params.items() if k != "resource"}

    inner = Primitive(f"{op.name}_ffi")
    inner.multiple_results = True
    inner.def_abstract_eval(lambda *avals, **params: op.inner_abstract(*avals, **params))
    inner.def_impl(functools.partial(apply_primitive, inner))
    mlir.register_lowering(inner, functools.partial(_lower_inner, op))
    op.inner = inner

    def body(*args):
        params = strip(dict(zip(statics, args[n:])))
        return tuple(op.local(None, *args[:n], **params))

    partitioned = custom_partitioning(body, static_argnums=tuple(range(n, n + len(statics))))

    def partition(*static_and_more):
        *static, mesh, arg_infos, _ = static_and_more
        params = dict(zip(statics, static))
        resource = params.pop("resource")
        sharding.check_mesh_resource(mesh, resource)
        with sharding.global_shard_guard(resource):
            arg_shardings, out_shardings, plan = op.shardings(mesh, arg_infos, **params)

        def lower(*args):
            return tuple(op.local(plan, *args, **params))

        return mesh, lower, tuple(out_shardings), tuple(arg_shardings)

    def infer(*static_and_more):
        *static, mesh, arg_infos, _ = static_and_more
        params = dict(zip(statics, static))
        with sharding.global_shard_guard(params.pop("resource")):
            return tuple(op.shardings(mesh, arg_infos, **params)[1])

    def rule(*static_and_more):
        *static, mesh, value_types, result_types = static_and_more
        params = strip(dict(zip(statics, static)))
        return op.mesh_sharding_rule(mesh, value_types, result_types, **params)

    partitioned.def_partition(
        partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule
    )

    outer = Primitive(op.name)
    outer.multiple_results = True
    outer.def_abstract_eval(lambda *avals, **params: op.abstract(*avals, **strip(params)))

    # Eagerly (outside jit) there is no mesh to partition over: run the unpartitioned body,
    # after the abstract evaluation's checks (which `local` may otherwise run only in part).
    def eager(*args, **params):
        op.abstract(*(jax.typeof(x) for x in args), **strip(params))
        return tuple(op.local(None, *args, **strip(params)))

    outer.def_impl(eager)

    def lower_outer(ctx, *args, **params):
        if _single_device(ctx.module_context.axis_context):
            fn = lambda *a: tuple(op.local(None, *a, **strip(params)))  # noqa: E731
        else:
            fn = lambda *a: partitioned(*a, *(params[k] for k in statics))  # noqa: E731
        return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)

    mlir.register_lowering(outer, lower_outer)
    # custom_partitioning needs the devices when it is lowered (jit otherwise lowers without).
    dispatch.prim_requires_devices_during_lowering.add(outer)
    batching.primitive_batchers[outer] = op.batch
    op.outer = outer
    return op
