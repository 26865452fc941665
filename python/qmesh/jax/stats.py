"""Counters of what qmesh's JAX ops did instead of the FP8 path, for users who opted into a
fallback (`allow_fallback=True`); without that opt-in such a call raises with the reason."""

from __future__ import annotations

import collections
import threading

_lock = threading.Lock()
_fallbacks: collections.Counter = collections.Counter()


def count_fallback(reason: str) -> None:
    """Records one fallback (at trace time: once per traced call site and shape)."""
    with _lock:
        _fallbacks[reason] += 1


def stats() -> dict:
    """{"fallbacks": total, "fallback_reasons": {reason: count}} since the last reset."""
    with _lock:
        return {"fallbacks": sum(_fallbacks.values()), "fallback_reasons": dict(_fallbacks)}


def reset_stats() -> None:
    with _lock:
        _fallbacks.clear()
