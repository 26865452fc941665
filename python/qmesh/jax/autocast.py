"""autocast: the recipe and MeshResource that qmesh's layers use when they are given none.

    with qmesh.jax.autocast(recipe=Float8CurrentScaling(),
                            mesh_resource=MeshResource(dp_resource="dp", tp_resource="tp")):
        y = model.apply(variables, x)        # modules, dense, layernorm_dense, mlp, drop-ins

TransformerEngine's `autocast` for JAX. Inside the block:
- enabled=True: layers without a recipe of their own use `recipe` (default DelayedScaling());
- enabled=False: they run in high precision (plain JAX math in the input's dtype, a
  DelayedScaling state passed through unchanged).
An explicit recipe argument always wins. Outside every autocast, each layer keeps its own
default: dense, layernorm_dense, mlp and the drop-ins DelayedScaling(), the Flax modules
(QuantizedModule.recipe None) high precision.

mesh_resource, when given, is the MeshResource of the block (global_shard_guard); None keeps
the one in force. collective_gemm, when given, is the collective GEMM of the block's
sequence-parallel GEMMs ("none", "ring" or "bidir": qmesh's rings, collective_gemm.py; False:
XLA's all-gather and reduce-scatter); None keeps the one in force (outside every block:
False). It applies to the FP8 layers given no collective_gemm of their own: dense and
layernorm_dense as column parallel, mlp and layernorm_mlp (fc1 column, fc2 row parallel), the
Flax modules in their own roles; an explicit argument (False included) wins, and a layer in
high precision keeps XLA's collectives. On exit, normally or by an exception, the previous
recipe, MeshResource and collective GEMM come back; blocks nest.

    with qmesh.jax.autocast(recipe=Float8CurrentScaling(), collective_gemm="ring",
                            mesh_resource=MeshResource(dp_resource="dp", tpsp_resource="tp")):
        y = model.apply(variables, x)        # the rings behind every sequence-parallel GEMM

Tracing: the setting is read when a layer is traced (for a Flax module: when its __call__
runs under init/apply), not when the compiled function runs. It is part of jax.jit's cache
key (a JAX user context, as the MeshResource), so a jitted function called under another
autocast is traced again (with a JAX that lacks jax.make_user_context, a jitted function keeps
the setting of its first trace: trace it inside the block). A Flax model must be initialised
and applied under the same recipe: a DelayedScaling state exists only where the recipe at
init had one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import jax

from qmesh.jax.recipe import DelayedScaling, check_recipe
from qmesh.jax.sharding import MeshResource, global_shard_guard


@dataclasses.dataclass(frozen=True)
class Setting:
    """What one autocast block sets: `recipe` None means high precision; `collective_gemm`
    the overlap of the rings ("none", "ring", "bidir"), None for XLA's collectives."""

    recipe: object
    collective_gemm: str | None = None


_state = threading.local()
_make_user_context = getattr(jax, "make_user_context", None)
_jit_key = _make_user_context(None) if _make_user_context else None


def current() -> Setting | None:
    """The Setting of the innermost autocast block (None outside every block)."""
    return getattr(_state, "setting", None)


def recipe_in_force(recipe, default):
    """The recipe a layer uses: `recipe` when given; else the innermost autocast's (None for
    high precision); else `default` (outside every autocast)."""
    if recipe is not None:
        return recipe
    setting = current()
    return default if setting is None else setting.recipe


@contextlib.contextmanager
def autocast(
    enabled: bool = True,
    recipe=None,
    mesh_resource: MeshResource | None = None,
    collective_gemm: str | bool | None = None,
):
    """Sets the recipe (None: DelayedScaling(); ignored with enabled=False, which means high
    precision) and, when given, the MeshResource and the collective GEMM ("none", "ring",
    "bidir"; False: XLA's collectives) of the layers called in the block; see the module
    docstring."""
    from qmesh.jax.collective_gemm import check_overlap

    if not isinstance(enabled, bool):
        raise TypeError(f"autocast: enabled must be True or False, not {enabled!r}")
    if enabled:
        recipe = DelayedScaling() if recipe is None else recipe
        check_recipe(recipe)
    previous = current()
    if collective_gemm is None:
        ring = None if previous is None else previous.collective_gemm
    else:
        ring = None if collective_gemm is False else check_overlap(collective_gemm)
    setting = Setting(recipe if enabled else None, ring)
    with contextlib.ExitStack() as stack:
        if mesh_resource is not None:
            stack.enter_context(global_shard_guard(mesh_resource))
        _state.setting = setting
        try:
            if _jit_key is not None:
                stack.enter_context(_jit_key(setting))
            yield setting
        finally:
            _state.setting = previous
