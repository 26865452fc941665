"""The drop-in: FP8 for an existing Flax model by changing one argument of nn.Dense.

    cls = make_dot_general_cls(DelayedScaling())
    nn.Dense(features, dot_general_cls=cls)        # or nn.Dense(features, dot_general=cls())

The module creates no parameters (the model's kernel, initialisation, sharding annotations and
optimizer stay as they are). With DelayedScaling it keeps, in the collection
`_overwrite_with_gradient` (flax.linen.fp8_ops.OVERWRITE_WITH_GRADIENT), the amax history and
scale of its input, kernel and output gradient (Flax's variable names); the backward pass
returns their updated values as their gradient, which TrainState.apply_gradients writes back.
Float8CurrentScaling keeps no state.
"""

from __future__ import annotations

import math
import weakref

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

from qmesh.jax.delayed_state import split_state
from qmesh.jax.dense import FALLBACKS, OPERANDS, dense
from qmesh.jax.recipe import DelayedScaling, MXFP8BlockScaling, check_recipe

# Per root scope (one init/apply): the unused half of the last split of each GEMM's state, for
# a module called more than once (see fp8_state).
_uses: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fp8_state(module: nn.Module, recipe, prefix: str = "") -> dict | None:
    """Declares (or reads) the delayed-scaling variables of one GEMM in `module`'s
    _overwrite_with_gradient collection; None for a recipe without state.

    A module called more than once in one traced apply (a shared drop-in, a Dense called
    twice) gives each call its own use of the state through delayed_state.split_state, so the
    calls' state gradients combine by maximum, as one call on all their rows would."""
    if not isinstance(recipe, DelayedScaling):
        return None
    state = {}
    for name in OPERANDS:
        h = f"{name}_amax_history"
        s = f"{name}_scale"
        state[h] = module.variable(
            OVERWRITE_WITH_GRADIENT, prefix + h, jnp.zeros, (recipe.amax_history_len,), jnp.float32
        ).value
        state[s] = module.variable(
            OVERWRITE_WITH_GRADIENT, prefix + s, jnp.ones, (), jnp.float32
        ).value
    first = state["input_scale"]
    if not isinstance(first, jax.core.Tracer):  # not traced: nothing to differentiate
        return state
    uses = _uses.setdefault(module.scope.root, {})
    key = (tuple(module.scope.path), prefix)
    if key in uses and uses[key][0] is first:  # a later call in the same apply
        state = uses[key][1]
    use, rest = split_state(state)
    uses[key] = (first, rest)
    return use


def _as_matrix(lhs, rhs, dimension_numbers):
    """lhs as [M, K] and rhs as [K, N] for a dot_general without batch dimensions, and the
    output shape (lhs free dims, then rhs free dims)."""
    (lc, rc), (lb, rb) = dimension_numbers
    if lb or rb:
        raise ValueError(
            "qmesh's dot_general takes no batch dimensions (got "
            f"{dimension_numbers}); use it for Dense/DenseGeneral kernels"
        )
    lc = [d % lhs.ndim for d in lc]
    rc = [d % rhs.ndim for d in rc]
    lfree = [d for d in range(lhs.ndim) if d not in lc]
    rfree = [d for d in range(rhs.ndim) if d not in rc]
    k = math.prod(lhs.shape[d] for d in lc)
    x = jnp.transpose(lhs, lfree + lc).reshape(-1, k)
    w = jnp.transpose(rhs, rc + rfree).reshape(k, -1)
    out_shape = tuple(lhs.shape[d] for d in lfree) + tuple(rhs.shape[d] for d in rfree)
    return x, w, out_shape


_MIXUP = (
    "qmesh's dot_general module: give nn.Dense the class as "
    "dot_general_cls=make_dot_general_cls(recipe), or an instance as "
    "dot_general=make_dot_general_cls(recipe)()"
)


def make_dot_general_cls(recipe, fallback: str | None = None):
    """A Flax module class computing lax.dot_general's result with qmesh's FP8 dense op.

    recipe: qmesh.jax.recipe.DelayedScaling(), Float8CurrentScaling(), Float8BlockScaling()
    or MXFP8BlockScaling() (GEMMs emulated, qmesh/jax/mxfp8_dense.py); fallback: None (raise
    when FP8 cannot be used) or "bf16" (run such calls in bfloat16, counted in stats; not used
    under MXFP8)."""
    if not isinstance(recipe, MXFP8BlockScaling):
        check_recipe(recipe)
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'bf16', not {fallback!r}")

    class QmeshDotGeneral(nn.Module):
        """lhs . rhs (contracting dims only) as an FP8 GEMM; see make_dot_general_cls."""

        def __new__(cls, *args, **kwargs):
            if args:  # Flax called the class as the dot_general function
                raise TypeError(_MIXUP + " (the class was passed as dot_general=)")
            return super().__new__(cls)

        @nn.compact
        def __call__(
            self,
            lhs=None,
            rhs=None,
            dimension_numbers=None,
            precision=None,
            preferred_element_type=None,
        ):
            if lhs is None or rhs is None or dimension_numbers is None:
                raise TypeError(_MIXUP + " (an instance was passed as dot_general_cls=)")
            x, w, out_shape = _as_matrix(jnp.asarray(lhs), jnp.asarray(rhs), dimension_numbers)
            out_dtype = preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype)
            y = dense(
                x,
                w.astype(x.dtype) if w.dtype != x.dtype else w,
                None,
                fp8_state(self, recipe),
                recipe=recipe,
                out_dtype=out_dtype,
                fallback=fallback,
            )
            return y.reshape(out_shape)

    QmeshDotGeneral.recipe = recipe
    return QmeshDotGeneral
