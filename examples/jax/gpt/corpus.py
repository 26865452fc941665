"""The byte-level corpus: Shakespeare's plays (data/shakespeare.txt, see data/SOURCE.md), split
into a train part (the first 90% of the bytes) and a held-out part (the last 10%), and the
batches of each. Everything is a function of (seed, step): every process computes the same
global batch and takes its shards, and a resumed run sees the batches it would have seen."""

from __future__ import annotations

import os

import numpy as np

VOCAB = 256  # byte-level tokens
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shakespeare.txt")
HELD_OUT_FRACTION = 0.1


def load(path: str = CORPUS) -> tuple[np.ndarray, np.ndarray]:
    """(train, held_out): the corpus's bytes as uint8 arrays, split at 90%."""
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), np.uint8)
    cut = int(len(data) * (1 - HELD_OUT_FRACTION))
    return data[:cut], data[cut:]


def _windows(data: np.ndarray, starts: np.ndarray, seq: int) -> np.ndarray:
    if len(data) < seq + 1:
        raise ValueError(f"a sequence of {seq} tokens needs {seq + 1} bytes, the corpus part "
                         f"has {len(data)}: use a smaller --seq")
    return data[starts[:, None] + np.arange(seq + 1)].astype(np.int32)


def train_batch(train: np.ndarray, step: int, batch: int, seq: int, seed: int) -> np.ndarray:
    """int32 [batch, seq + 1]: random windows of the train part for `step` (inputs are
    [:, :-1], targets [:, 1:])."""
    starts = np.random.default_rng((seed, step)).integers(0, len(train) - seq, batch)
    return _windows(train, starts, seq)


def held_out_batches(held_out: np.ndarray, count: int, batch: int, seq: int) -> list[np.ndarray]:
    """`count` int32 [batch, seq + 1] batches of windows spread evenly over the held-out part
    (the same ones at every evaluation)."""
    starts = np.linspace(0, len(held_out) - seq - 1, count * batch).astype(np.int64)
    return [_windows(held_out, s, seq) for s in starts.reshape(count, batch)]
