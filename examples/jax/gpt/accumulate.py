"""Gradient accumulation over microbatches that records in the FP8 state what one big batch
would record.

A microbatch's gradient of the `_overwrite_with_gradient` collection is not a gradient: it is
the delayed-scaling state with that microbatch's amaxes recorded (qmesh.jax.dense). Every
microbatch starts from the same state, so their returned states differ only where the step's
amax went: the histories in one row (the newest), and, where the package returns the scale
updated from that amax rather than the scale the step used (qmesh before its state rework),
the scales. The big batch's amax is the maximum of the microbatches' amaxes, hence:

- `*amax_history`: the elementwise maximum of the microbatches' histories (identical rows stay
  as they are, the newest row holds the largest amax);
- `*scale`: the elementwise minimum. Where every microbatch returns the scale the step used,
  they are all equal; where each returns fp8_max / 2**margin / amax (decreasing in the amax),
  the largest amax gives the smallest scale.

This is right under both of qmesh's state conventions, and equals the package's own
qmesh.jax.delayed_state.combine_state_grads where that exists. Summing the states, as a plain
accumulation of gradients does, would corrupt them; keeping the last microbatch's would lose
the other microbatches' amaxes. The parameter gradients are summed (each microbatch's loss is
its share of the big batch's mean).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT


def _combine_fp8(path, a, b):
    name = str(getattr(path[-1], "key", path[-1]))
    if name.endswith("amax_history"):
        return jnp.maximum(a, b)
    if name.endswith("scale"):
        return jnp.minimum(a, b)
    raise ValueError(f"accumulate: unknown FP8 state variable {jax.tree_util.keystr(path)} in "
                     f"{OVERWRITE_WITH_GRADIENT} (expected *amax_history and *scale)")


def combine(a: dict, b: dict) -> dict:
    """The gradients (variables-shaped dicts) of two microbatches of one batch, combined:
    parameters summed, the FP8 state as described in the module docstring."""
    out = {k: jax.tree.map(jnp.add, v, b[k]) for k, v in a.items() if k != OVERWRITE_WITH_GRADIENT}
    if OVERWRITE_WITH_GRADIENT in a:
        out[OVERWRITE_WITH_GRADIENT] = jax.tree_util.tree_map_with_path(
            _combine_fp8, a[OVERWRITE_WITH_GRADIENT], b[OVERWRITE_WITH_GRADIENT])
    return out


def microbatches(tokens, count: int):
    """tokens [batch, ...] as [count, batch // count, ...]; microbatch i takes rows i, i + count,
    ..., so that every data-parallel shard of the batch contributes to every microbatch."""
    b = tokens.shape[0]
    if count < 1 or b % count:
        raise ValueError(f"the batch ({b}) must be divisible by the number of microbatches ({count})")
    return tokens.reshape(b // count, count, *tokens.shape[1:]).swapaxes(0, 1)


def accumulated_grad(loss_and_grad, variables, tokens, count: int, key=None):
    """(loss, gradient) of the batch `tokens` over `count` microbatches, run one after the other
    (lax.scan). loss_and_grad(variables, tokens, denominator, key) gives the summed loss of
    `tokens` divided by `denominator` and its gradient: the denominator is the batch's token
    count, so the losses and parameter gradients of the microbatches add up to the batch's.
    `key` (None: none) is the step's stochastic-rounding key: one microbatch takes it as it
    is, several take jax.random.fold_in(key, i), each its own."""
    denominator = tokens.shape[0] * (tokens.shape[1] - 1)
    if count == 1:
        return loss_and_grad(variables, tokens, denominator, key)

    def part_grad(part, i):
        return loss_and_grad(variables, part, denominator,
                             None if key is None else jax.random.fold_in(key, i))

    parts = microbatches(tokens, count)
    first = part_grad(parts[0], 0)

    def body(carry, xs):
        loss, grad = part_grad(*xs)
        return (carry[0] + loss, combine(carry[1], grad)), None

    return jax.lax.scan(body, first, (parts[1:], jnp.arange(1, count)))[0]
