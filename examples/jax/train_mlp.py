"""Trains an MLP on the C++ example's teacher task (targets tanh(x A^T) B^T of a random teacher
network, x ~ N(0, 1)) with Flax + optax, in BF16 and in FP8 through qmesh's drop-in
(DelayedScaling, Float8CurrentScaling, Float8BlockScaling, and MXFP8BlockScaling and
NVFP4BlockScaling with emulated GEMMs), on the same data; prints progress and FP8 state,
writes a CSV and a PNG of the loss curves.

    python examples/jax/train_mlp.py --steps 200 --out build/train_mlp_jax

Needs the qmesh package (pip install ./python, or PYTHONPATH=python with
QMESH_JAX_LIBRARY_DIR set to the build directory of qmesh_jax_ffi).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from qmesh.jax.flax import fp8_meta, make_dot_general_cls
from qmesh.jax.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from png import line_plot  # noqa: E402


class MLP(nn.Module):
    hidden: int
    ffn: int
    dtype: object = jnp.float32
    dot: object = None

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(self.ffn, dtype=self.dtype, dot_general_cls=self.dot)(x)
        x = nn.gelu(x)
        return nn.Dense(self.hidden, dtype=self.dtype, dot_general_cls=self.dot)(x)


class Teacher:
    """The teacher network (fixed random A, B) and its batches, one per step."""

    def __init__(self, hidden: int, seed: int):
        rng = np.random.default_rng(seed)
        self.a = rng.standard_normal((hidden, hidden)).astype(np.float32) * np.sqrt(2.0 / hidden)
        self.b = rng.standard_normal((hidden, hidden)).astype(np.float32) * 1.6 / np.sqrt(hidden)
        self.seed, self.hidden = seed, hidden

    def batch(self, step: int, tokens: int):
        x = np.random.default_rng((self.seed, step)).standard_normal((tokens, self.hidden))
        x = x.astype(np.float32)
        return jnp.asarray(x), jnp.asarray(np.tanh(x @ self.a.T) @ self.b.T)


def train(name, model, teacher, args):
    x0, _ = teacher.batch(0, args.tokens)
    # NVFP4's stochastic rounding draws its keys from the rng stream "sr_rng": a new key each
    # step (the other recipes do not use it).
    sr = jax.random.key(args.seed + 1)
    variables = model.init({"params": jax.random.key(args.seed), "sr_rng": sr}, x0)
    ts = train_state.TrainState.create(apply_fn=model.apply, params=variables,
                                       tx=optax.adam(args.lr))

    @jax.jit
    def step(ts, x, t):
        rngs = {"sr_rng": jax.random.fold_in(sr, ts.step)}

        def loss_fn(p):
            return jnp.mean((ts.apply_fn(p, x, rngs=rngs).astype(jnp.float32) - t) ** 2)
        loss, grads = jax.value_and_grad(loss_fn)(ts.params)
        return ts.apply_gradients(grads=grads), loss

    losses, start = [], time.perf_counter()
    for s in range(args.steps):
        ts, loss = step(ts, *teacher.batch(s, args.tokens))
        losses.append(float(loss))
        if s % args.log_every == 0 or s == args.steps - 1:
            print(f"[{name:>8}] step {s:5d}  loss {losses[-1]:.5f}  "
                  f"{time.perf_counter() - start:6.1f} s", flush=True)
    return losses, ts.params


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=128, help="model and teacher width")
    p.add_argument("--ffn", type=int, default=512, help="the MLP's hidden width")
    p.add_argument("--tokens", type=int, default=256, help="tokens per step")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--out", default="train_mlp_jax", help="prefix of the CSV and PNG written")
    args = p.parse_args(argv)
    for name in ("hidden", "ffn", "tokens", "steps", "log_every"):
        value = getattr(args, name)
        if value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, not {value}")
        if name in ("hidden", "ffn", "tokens") and value % 32:  # MXFP8's blocks (NVFP4's: 16)
            p.error(f"--{name} must be a multiple of 32 (the MXFP8 run's blocks), not {value}")

    teacher = Teacher(args.hidden, args.seed)
    runs = {
        "bf16": MLP(args.hidden, args.ffn, dtype=jnp.bfloat16),
        "delayed": MLP(args.hidden, args.ffn, dot=make_dot_general_cls(DelayedScaling(amax_history_len=16))),
        "current": MLP(args.hidden, args.ffn, dot=make_dot_general_cls(Float8CurrentScaling())),
        "block": MLP(args.hidden, args.ffn, dot=make_dot_general_cls(Float8BlockScaling())),
        "mxfp8": MLP(args.hidden, args.ffn,
                     dot=make_dot_general_cls(MXFP8BlockScaling(emulate=True))),
        "nvfp4": MLP(args.hidden, args.ffn,
                     dot=make_dot_general_cls(NVFP4BlockScaling(emulate=True))),
    }
    curves = {}
    for name, model in runs.items():
        curves[name], params = train(name, model, teacher, args)
        for layer, ops in fp8_meta(params).items():
            for op, m in ops.items():
                print(f"    {layer}/{op}: amax {m['amax']:.4g}  scale {m['scale']:.4g}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *curves])
        for s in range(args.steps):
            w.writerow([s, *(f"{curves[n][s]:.6g}" for n in curves)])
    line_plot(args.out + ".png", curves)
    tail = max(1, args.steps // 10)  # the last tenth, averaged: one batch is noisy
    final = {n: float(np.mean(c[-tail:])) for n, c in curves.items()}
    for n, v in final.items():
        print(f"final loss {n:>8}: {v:.5f}  ({(v / final['bf16'] - 1) * 100:+.1f}% vs bf16)")
    print(f"wrote {args.out}.csv and {args.out}.png (blue bf16, red delayed, green current, "
          "purple block, then mxfp8 and nvfp4)")


if __name__ == "__main__":
    main()
