"""Counters of what qmesh's JAX ops did instead of the plain FP8 path, read with
`qmesh.jax.stats()` and cleared with `qmesh.jax.stats.reset_stats()`:

- fallbacks: calls that ran in bfloat16 because the user opted in (`fallback="bf16"`; without
  that opt-in such a call raises with the reason), counted at trace time;
- invalid_scales: delayed-scaling scales that were not normal positive floats and were
  replaced by the previous valid scale (or 1), counted when the backward pass runs;
- unthreaded_states: layers whose delayed-scaling state is not passed from step to step
  (docs/flax.md "State semantics"), counted once per layer when detected;
- emulated_gemms: GEMMs with MXFP8 or NVFP4 operands that ran emulated (dequantized, then a
  float32-accumulated GEMM; the recipe's emulate=True, emulation.py), counted at trace time.
"""

from __future__ import annotations

import collections
import threading

_lock = threading.Lock()
_fallbacks: collections.Counter = collections.Counter()
_events: collections.Counter = collections.Counter()
EVENTS = ("invalid_scales", "unthreaded_states", "emulated_gemms")


def count_fallback(reason: str) -> None:
    """Records one fallback (at trace time: once per traced call site and shape)."""
    with _lock:
        _fallbacks[reason] += 1


def count(event: str, n: int = 1) -> None:
    """Records n occurrences of one of EVENTS."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}; one of {EVENTS}")
    with _lock:
        _events[event] += n


def stats() -> dict:
    """{"fallbacks": total, "fallback_reasons": {reason: count}, "invalid_scales": n,
    "unthreaded_states": n, "emulated_gemms": n} since the last reset_stats(). Called as
    qmesh.jax.stats()."""
    with _lock:
        out = {"fallbacks": sum(_fallbacks.values()), "fallback_reasons": dict(_fallbacks)}
        out.update({e: _events[e] for e in EVENTS})
        return out


def reset_stats() -> None:
    with _lock:
        _fallbacks.clear()
        _events.clear()
