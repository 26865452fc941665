"""wrap_function_in_state_module: a function of FP8 GEMMs as a parameterless Flax module that
keeps their delayed-scaling state, the base of the drop-ins (make_dot_general_cls,
make_einsum_cls).

    def scaled_matmul(states, x, kernel):
        return qmesh.jax.dense(x, kernel, None, states(), recipe=states.recipe)

    Matmul = wrap_function_in_state_module(scaled_matmul, DelayedScaling(), "Matmul")
    y = Matmul()(x, kernel)                     # inside a compact module

The module creates no parameters. Each call runs f(states, *args, **kwargs): `states.recipe`
is the recipe in force (the module's; None: the autocast's, see qmesh.jax.autocast; None
again under autocast(enabled=False): high precision) and `states(prefix)` declares (at init)
or reads (at apply) the delayed-scaling state of one GEMM in the collection
`_overwrite_with_gradient` (flax.linen.fp8_ops.OVERWRITE_WITH_GRADIENT): input_, kernel_ and
output_grad_ amax_history and scale, each name after `prefix` (one prefix per GEMM); None for
a recipe without state. The backward pass returns the updated state as its gradient, which
TrainState.apply_gradients writes back (docs/flax.md). `states.sr_key()` is the key of a
recipe's stochastic rounding (NVFP4), drawn from the Flax rng stream "sr_rng" (sr_key).
"""

from __future__ import annotations

import weakref
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

from qmesh.jax.autocast import recipe_in_force
from qmesh.jax.delayed_state import OPERANDS, split_state
from qmesh.jax.recipe import DelayedScaling, check_recipe, uses_sr

SR_RNG = "sr_rng"  # the Flax rng stream of stochastic rounding (TransformerEngine's name)

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


def sr_key(module: nn.Module, recipe):
    """A fresh key from `module`'s rng stream "sr_rng" when `recipe` rounds stochastically
    (NVFP4BlockScaling by default), else None. Raises ValueError, saying how to pass it, when
    the stream is missing."""
    if not uses_sr(recipe):
        return None
    if not module.has_rng(SR_RNG):
        raise ValueError(
            f"{type(module).__name__}: NVFP4BlockScaling rounds the gradients stochastically "
            f"and draws its keys from the Flax rng stream '{SR_RNG}': pass "
            f"rngs={{'{SR_RNG}': jax.random.key(0)}} to init and apply (a new key each step), "
            "or use NVFP4BlockScaling(disable_stochastic_rounding=True)"
        )
    return module.make_rng(SR_RNG)


class States:
    """The first argument of a wrapped function: the recipe in force and, called with a
    prefix, the state of one of its GEMMs (see the module docstring)."""

    def __init__(self, module: nn.Module, recipe):
        self.module = module
        self.recipe = recipe

    def __call__(self, prefix: str = "") -> dict | None:
        return fp8_state(self.module, self.recipe, prefix)

    def sr_key(self):
        """A fresh stochastic-rounding key for one GEMM, or None (see sr_key)."""
        return sr_key(self.module, self.recipe)


def wrap_function_in_state_module(f: Callable, recipe=None, name: str | None = None) -> type:
    """A parameterless Flax module class whose instances compute f(states, *args, **kwargs)
    (see the module docstring). recipe: DelayedScaling(), Float8CurrentScaling(),
    Float8BlockScaling(), MXFP8BlockScaling(), NVFP4BlockScaling() or None (the autocast's when
    called; DelayedScaling() outside autocast); name: the class name (Flax names instances
    after it; default f's name). The class carries `recipe`."""
    if recipe is not None:
        check_recipe(recipe)
    cls_name = name or f.__name__

    class StateModule(nn.Module):
        def __new__(cls, *args, **kwargs):
            if args:  # the class called as the function
                raise TypeError(
                    f"the module class {cls_name} was called with the function's arguments: "
                    f"create an instance ({cls_name}()) and call that"
                )
            return super().__new__(cls)

        @nn.compact
        def __call__(self, *args, **kwargs):
            return f(States(self, recipe_in_force(recipe, DelayedScaling())), *args, **kwargs)

    StateModule.__name__ = StateModule.__qualname__ = cls_name
    StateModule.__doc__ = f.__doc__
    StateModule.recipe = recipe
    return StateModule
