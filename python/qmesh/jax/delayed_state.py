"""The delayed-scaling state of one dense layer through a training step, and how the state's
"gradients" combine.

State (Flax's names): input_/kernel_/output_grad_ amax_history (float32 [L], row 0 the newest
amax) and _scale (float32 scalar, the scale the last step used). A step:

- forward (`step_scales`): this step's scales come from the state by qmesh's delayed-scaling
  update (docs/design/fp8_scaling.md: from the amaxes of steps < t), which also rolls the history
  and frees row 0;
- backward (`recorded_state`): this step's amaxes go into row 0; the result (the rolled
  history with row 0 filled, and the scales this step used) is the state's "gradient", which
  Flax's TrainState writes back (`_overwrite_with_gradient`).

Every use of one state in a step therefore returns the same history and scales except row 0,
and the exact combination of several uses is the elementwise **maximum** (row 0 becomes the
largest amax, as one big batch would record). Under `vmap` the amaxes of the batch are reduced
by maximum before they are recorded (`batch_max`), so a vmapped layer returns the state of one
big batch. `split_state` (a module called twice) and `share_state` (the xs of a scan over
microbatches) give several uses whose gradients JAX then combines by that maximum instead of
adding them; `combine_state_grads` is the maximum for gradients computed separately
(gradient accumulation over microbatches); 0, what JAX gives a layer whose output did not reach the
loss, is its neutral element (valid entries are >= 0).

A state whose scale is 0 and whose history is all zero is that untouched "gradient" written
back: it restarts from scale 1 (`keep_unused_state` keeps the previous state instead). Inside
a traced step a scale that is not a normal positive float32 (0, denormal, negative, NaN, inf)
is never used: the previous valid scale (else 1) is kept and the replacement counted in
qmesh.jax.stats() ("invalid_scales") when the backward pass runs. Outside tracing such a scale
raises (`check_state`). A history that stays all zero through UNTHREADED_AFTER backward passes
of one traced layer (its new state is not passed on) is reported once ("unthreaded_states" and
a RuntimeWarning). Both reports cost one device-side condition per layer and backward pass
(`set_reporting`).
"""

from __future__ import annotations

import functools
import itertools
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from qmesh.jax import stats
from qmesh.jax.common import F32
from qmesh.jax.scaling import update_delayed_scaling

OPERANDS = ("input", "kernel", "output_grad")
FLT_MIN = float(np.finfo(np.float32).tiny)
FLT_MAX = float(np.finfo(np.float32).max)
# Backward passes a layer may run on a history that never received an amax before its state is
# reported as not threaded (gradient accumulation runs several on the first step's state).
UNTHREADED_AFTER = 16


def valid_scale(s):
    """Whether each scale is a normal positive finite float32 (what a quantize may use)."""
    return (s >= FLT_MIN) & (s <= FLT_MAX)


def _is_untouched(scale, history):
    return (scale == 0) & jnp.all(history == 0, axis=0)


def check_state(state, where: str) -> None:
    """Raises ValueError for a concrete state holding a scale no quantize may use (the
    untouched all-zero state excepted, see the module docstring). Traced states pass."""
    for o in OPERANDS:
        s, h = state[f"{o}_scale"], state[f"{o}_amax_history"]
        if isinstance(s, jax.core.Tracer) or isinstance(h, jax.core.Tracer):
            continue
        s, h = np.float32(np.reshape(np.asarray(s), ())), np.asarray(h)
        if not (FLT_MIN <= s <= FLT_MAX) and not (s == 0 and not np.any(h)):
            raise ValueError(
                f"{where}: state {o}_scale is {s!r}; a scale must be a normal positive finite "
                "float32. Restore the state from a checkpoint or start from init_state(recipe)"
            )


# ---- per-step scales and the recorded state ---------------------------------------------------

_sites = itertools.count()
_lock = threading.Lock()
_fresh_backwards: dict[int, int] = {}


def _report(site: int, invalid, fresh):
    """Host side of one backward pass: counts the replaced scales, and reports the state of
    call site `site` once it has run UNTHREADED_AFTER backward passes on a fresh history."""
    if int(np.sum(invalid)):
        stats.count("invalid_scales", int(np.sum(invalid)))
    if not np.any(fresh):
        return
    with _lock:
        _fresh_backwards[site] = _fresh_backwards.get(site, 0) + 1
        reached = _fresh_backwards[site] == UNTHREADED_AFTER
    if reached:
        stats.count("unthreaded_states")
        warnings.warn(
            f"qmesh: a delayed-scaling state went through {UNTHREADED_AFTER} backward passes "
            "without ever holding an amax: the updated state (the gradient of the "
            "_overwrite_with_gradient collection, or of `state` for qmesh.jax.dense) is not "
            "passed to the next step, so the scales stay 1. See docs/flax.md 'State "
            "semantics'.",
            RuntimeWarning,
            stacklevel=2,
        )


_reporting = True


def reporting() -> bool:
    """Whether layers called now report (set_reporting)."""
    return _reporting


def set_reporting(enabled: bool) -> None:
    """Whether layers called from now on report replaced scales and unthreaded states to
    qmesh.jax.stats() (default True; a function already traced keeps what it was traced
    with). Each report is a device-side condition per layer and backward pass; on CUDA, XLA
    reads such a condition's predicate on the host, so set_reporting(False) removes that
    synchronisation (and the counting)."""
    global _reporting
    _reporting = bool(enabled)


def step_scales(state, recipe):
    """(history [L, 3] rolled with row 0 free, scales [3], how many scales were replaced):
    this step's scales of input, kernel and output gradient from `state` (see the module
    docstring)."""
    history = jnp.stack([jnp.asarray(state[f"{o}_amax_history"], F32) for o in OPERANDS], axis=1)
    previous = jnp.stack([jnp.reshape(jnp.asarray(state[f"{o}_scale"], F32), ()) for o in OPERANDS])
    base = jnp.where(valid_scale(previous), previous, jnp.float32(1))
    replaced = ~valid_scale(previous) & ~_is_untouched(previous, history)
    fmt = recipe.fp8_format
    history, scale = update_delayed_scaling(
        history, base, (fmt.fwd_dtype, fmt.fwd_dtype, fmt.bwd_dtype), recipe
    )
    ok = valid_scale(scale)
    scale = jnp.where(ok, scale, base)
    invalid = jnp.sum(replaced) + jnp.sum(~ok)
    return history, scale, invalid


def recorded_state(history, scale, invalid, amaxes, like, report: bool = True):
    """The state after this step: `history` (from step_scales) with row 0 = amaxes [3] (reduced
    by maximum over a vmapped batch), `scale` the scales used; shapes as in `like`. Reports
    `invalid` (the scales step_scales replaced) and a fresh history to qmesh.jax.stats()
    unless `report` is False."""
    amaxes = batch_max(jnp.stack(amaxes).astype(F32), history)
    if report:
        fresh = jnp.all(history == 0)
        report = functools.partial(_report, next(_sites))
        lax.cond(
            (invalid > 0) | fresh,
            lambda i, f: jax.debug.callback(report, i, f),
            lambda i, f: None,
            invalid,
            fresh,
        )
    history = history.at[0].set(amaxes)
    new = {}
    for i, o in enumerate(OPERANDS):
        new[f"{o}_amax_history"] = history[:, i]
        new[f"{o}_scale"] = scale[i].reshape(jnp.shape(like[f"{o}_scale"]))
    return new


# ---- batch_max: the amaxes of a vmapped batch, reduced to the state's batching -----------------

batch_max_p = Primitive("qmesh_batch_max")
batch_max_p.def_impl(lambda x, like: x)
batch_max_p.def_abstract_eval(lambda x, like: x)
mlir.register_lowering(batch_max_p, lambda ctx, x, like: [x])
ad.defjvp(batch_max_p, lambda g, x, like: g, None)


def _batch_max_rule(args, dims):
    (x, _), (dx, dlike) = args, dims
    if dx is None:
        return x, None
    if dlike is None:  # one state for the whole batch: its largest amax
        return jnp.max(x, axis=dx), None
    return x, dx  # a state per batch element (e.g. an ensemble): each keeps its own


batching.primitive_batchers[batch_max_p] = _batch_max_rule


def batch_max(x, like):
    """x, except under vmap: where `like` (the state) is not batched, the maximum of x over
    the batch."""
    return batch_max_p.bind(x, like)


# ---- combining and writing back the state's gradients -----------------------------------------


def combine_state_grads(a, b):
    """The gradients of two uses of the same state (e.g. two microbatches of one step),
    combined exactly: the elementwise maximum."""
    return jax.tree.map(jnp.maximum, a, b)


def keep_unused_state(new, old):
    """`new` (a state gradient, or a tree of them) with every operand whose gradient is the
    untouched 0 (its layer's output did not reach the loss) replaced by `old`'s."""

    def one(n, o):
        out = dict(n)
        for op in OPERANDS:
            s, h = f"{op}_scale", f"{op}_amax_history"
            if s in n and h in n:
                unused = _is_untouched(jnp.reshape(n[s], ()), n[h][:, None])[0]
                out[s] = jnp.where(unused, o[s], n[s])
                out[h] = jnp.where(unused, o[h], n[h])
        return out

    def walk(n, o):
        if isinstance(n, dict) and any(f"{op}_scale" in n for op in OPERANDS):
            return one(n, o)
        if isinstance(n, dict):
            return {k: walk(v, o[k]) for k, v in n.items()}
        return n

    return walk(
        dict(new) if hasattr(new, "items") else new, dict(old) if hasattr(old, "items") else old
    )


# ---- several uses of one state in one step ---------------------------------------------------


@jax.custom_vjp
def split_state(state):
    """(state, state): two uses of one state whose gradients combine by maximum (a chain of
    splits gives any number of uses; an unused one contributes the neutral 0)."""
    return state, state


split_state.defvjp(
    lambda state: ((state, state), None), lambda _, cts: (jax.tree.map(jnp.maximum, *cts),)
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def share_state(state, n: int):
    """The state stacked n times (leading axis n), e.g. as the `xs` of a lax.scan over n
    microbatches; the gradients of the n copies combine by maximum."""
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n, *jnp.shape(a))), state)


share_state.defvjp(
    lambda state, n: (share_state(state, n), None),
    lambda n, _, ct: (jax.tree.map(lambda a: jnp.max(a, axis=0), ct),),
)
