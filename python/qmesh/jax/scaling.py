"""The delayed-scaling update of many tensors in one call (qmesh's fused update kernel).

State, as qmesh keeps it (docs/design/fp8_scaling.md): amax_history float32 [L, n] with column i
the history of tensor i and row 0 this step's amax (already the global amax: the quantize
primitives reduce it over the mesh), scale float32 [n]. The update, per tensor whose amax is not
0: amax = max(history) skipping NaN (or history[0] with "most_recent");
scale = (fp8_max * 2**-margin) / amax (kept for a zero or non-finite amax, FLT_MAX when the
quotient overflows), TransformerEngine's rule (docs/numerics.md "Delayed scaling"); the
history rolls by one and row 0 is zeroed for the next step. Tensors whose amax is 0 did not
run: untouched.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from qmesh.jax.common import F32, fp8_max
from qmesh.jax.primitive import Op, register
from qmesh.jax.recipe import DelayedScaling


@register
class DelayedScalingUpdate(Op):
    """(amax_history [L, n], scale [n], fp8_max [n]) -> (new history, new scale)."""

    name = target = "qmesh_delayed_scaling_update"
    num_inputs = 3
    static_params = ("margin", "amax_compute_algo")
    output_aliases = {0: 0, 1: 1}

    @classmethod
    def abstract(cls, history, scale, maxima, *, margin, amax_compute_algo):
        if history.dtype != F32 or history.ndim != 2:
            raise TypeError(
                f"amax_history must be float32 [history_len, n], not "
                f"{history.dtype}{list(history.shape)}"
            )
        n = history.shape[1]
        for aval, what in ((scale, "scale"), (maxima, "fp8_max")):
            if aval.dtype != F32 or aval.shape != (n,):
                raise TypeError(
                    f"{what} must be float32 [{n}] (one per tensor), not "
                    f"{aval.dtype}{list(aval.shape)}"
                )
        return (jax.core.ShapedArray(history.shape, F32), jax.core.ShapedArray(scale.shape, F32))

    @classmethod
    def attributes(cls, *, margin, amax_compute_algo):
        return dict(
            margin=np.float32(margin),
            amax_compute_algo=np.int32(0 if amax_compute_algo == "max" else 1),
        )

    @classmethod
    def empty(cls, history, scale, maxima, **params):
        return history, scale

    @classmethod
    def sharding_rule(cls, value_types, result_types, **params):
        return "l n, n, n -> l n, n"


def update_delayed_scaling(amax_history, scale, dtypes, recipe: DelayedScaling = DelayedScaling()):
    """Updates the delayed-scaling state of n tensors at once; returns (amax_history, scale).

    amax_history: float32 [recipe.amax_history_len, n], row 0 this step's (global) amaxes;
    scale: float32 [n]; dtypes: the FP8 dtype of each tensor (sets its fp8_max)."""
    if not isinstance(recipe, DelayedScaling):
        raise TypeError(
            f"recipe must be a qmesh.jax.recipe.DelayedScaling, not {type(recipe).__name__}"
        )
    amax_history = jnp.asarray(amax_history)
    if amax_history.ndim == 2 and amax_history.shape[0] != recipe.amax_history_len:
        raise ValueError(
            f"amax_history has {amax_history.shape[0]} rows but the recipe's "
            f"amax_history_len is {recipe.amax_history_len}"
        )
    dtypes = list(dtypes)
    if amax_history.ndim == 2 and len(dtypes) != amax_history.shape[1]:
        raise ValueError(f"{len(dtypes)} dtypes given for {amax_history.shape[1]} tensors")
    maxima = jnp.asarray(np.array([fp8_max(d) for d in dtypes], np.float32).reshape(-1))
    return tuple(
        DelayedScalingUpdate.bind(
            amax_history,
            jnp.asarray(scale),
            maxima,
            margin=float(recipe.margin),
            amax_compute_algo=recipe.amax_compute_algo,
        )
    )
