"""Flax's TrainState with the delayed-scaling state of unused layers kept.

    state = qmesh.jax.flax.TrainState.create(apply_fn=model.apply, params=variables, tx=tx)

flax.training.train_state.TrainState writes the gradient of the _overwrite_with_gradient
collection as the new state; a layer whose output did not reach the loss gets the gradient 0
and would restart from a fresh state. This TrainState keeps its previous state instead
(qmesh.jax.delayed_state.keep_unused_state); everything else is Flax's.
"""

from __future__ import annotations

from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT
from flax.training import train_state

from qmesh.jax.delayed_state import keep_unused_state


class TrainState(train_state.TrainState):
    """flax.training.train_state.TrainState whose apply_gradients keeps the delayed-scaling
    state of layers whose output did not reach the loss."""

    def apply_gradients(self, *, grads, **kwargs):
        if OVERWRITE_WITH_GRADIENT in grads:
            kept = keep_unused_state(
                grads[OVERWRITE_WITH_GRADIENT], self.params[OVERWRITE_WITH_GRADIENT]
            )
            grads = {**grads, OVERWRITE_WITH_GRADIENT: kept}
        return super().apply_gradients(grads=grads, **kwargs)
