#!/usr/bin/env python3
"""Forward + backward of one Flax transformer layer (LayerNorm, fused QKV Dense, attention by
nn.dot_product_attention, output Dense, LayerNorm, GELU MLP; residuals around both halves) at
batch 4, seq 2048, hidden 4096, ffn 16384, 32 heads in bfloat16, under jax.jit on the default
device, in six variants:

  bf16           nn.Dense with XLA's dot (dot_general None)
  flax_fp8       nn.Dense(dot_general_cls=flax.linen.fp8_ops.Fp8DotGeneral)
  qmesh_delayed  nn.Dense(dot_general_cls=make_dot_general_cls(DelayedScaling()))
  qmesh_current  nn.Dense(dot_general_cls=make_dot_general_cls(Float8CurrentScaling()))
  qmesh_modules  the same layer from qmesh's modules: LayerNormDenseGeneral (QKV),
                 DenseGeneral (output), LayerNormMLP, with DelayedScaling
  qmesh_delayed_quiet  qmesh_delayed traced with qmesh.jax.delayed_state.set_reporting(False):
                 without the per-layer report condition, whose predicate XLA reads on the
                 host on GPUs (the difference to qmesh_delayed is what reporting costs)

Each variant runs warm-up steps, then --steps steps each waited for (block_until_ready); the
table gives the mean and median step time and the speed-ups against bf16 and flax_fp8. The
FP8 state (collection _overwrite_with_gradient) comes back as its gradient and is written
into the next step's variables, as TrainState.apply_gradients does (docs/flax.md); the
parameters stay fixed. For every variant the optimized HLO is searched for FP8 GEMMs: XLA's
FP8 cuBLASLt custom calls (`__cublas$lt$matmul$f8`, which XLA's GPU compiler makes from
Flax's quantize-dequantize when it can; the CPU compiler makes none) and qmesh GEMM calls
with FP8 operands. The comparison with Flax's FP8 is only fair when its count is not 0.

    PYTHONPATH=python QMESH_JAX_LIBRARY_DIR=build/src python bench/flax_layer_bench.py \\
        --json layer.json              # on a GPU
    ... bench/flax_layer_bench.py --scale 32 --steps 3 --warmup 1   # a tiny CPU run

--profile-steps N runs N more steps of each variant between cudaProfilerStart and
cudaProfilerStop (bench/cuda_profiler.py), for a profiler that starts with profiling off;
where JAX runs on no CUDA GPU it says so and profiles nothing; on a GPU without a CUDA runtime
library to load it stops at once, naming the libraries it tried:

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        python3 bench/flax_layer_bench.py --variants bf16 --warmup 1 --steps 1 \\
        --profile-steps 1 >ncu-flax-bf16.csv       # then launch/ncu_layer_summary.py
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from cuda_profiler import load_cudart, profiled
from flax.linen import fp8_ops
from hlo_gemms import fp8_gemm_counts

from qmesh.jax import delayed_state
from qmesh.jax.flax import DenseGeneral, LayerNormDenseGeneral, LayerNormMLP, make_dot_general_cls
from qmesh.jax.recipe import DelayedScaling, Float8CurrentScaling

STATE = fp8_ops.OVERWRITE_WITH_GRADIENT
VARIANTS = ("bf16", "flax_fp8", "qmesh_delayed", "qmesh_current", "qmesh_modules",
            "qmesh_delayed_quiet")


def _attention(qkv, heads):
    """Multi-head attention of a fused [b, s, 3h] projection: [b, s, h]."""
    b, s, h3 = qkv.shape
    h = h3 // 3
    qkv = qkv.reshape(b, s, 3, heads, h // heads)
    a = nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dtype=qkv.dtype)
    return a.reshape(b, s, h)


class SeedLayer(nn.Module):
    """The plain Flax layer; dot_general_cls swaps the GEMMs of its four Dense layers."""

    hidden: int
    ffn: int
    heads: int
    dot_general_cls: Any = None
    dtype: Any = jnp.bfloat16

    @nn.compact
    def __call__(self, x):
        dense = functools.partial(nn.Dense, dtype=self.dtype, dot_general_cls=self.dot_general_cls)
        y = nn.LayerNorm(dtype=self.dtype)(x)
        x = x + dense(self.hidden, name="out")(_attention(dense(3 * self.hidden, name="qkv")(y),
                                                          self.heads))
        y = nn.LayerNorm(dtype=self.dtype)(x)
        return x + dense(self.hidden, name="fc2")(nn.gelu(dense(self.ffn, name="fc1")(y)))


class QmeshModulesLayer(nn.Module):
    """The same layer from qmesh's Flax modules (LayerNorms fused into the modules)."""

    hidden: int
    ffn: int
    heads: int
    recipe: Any
    dtype: Any = jnp.bfloat16

    @nn.compact
    def __call__(self, x):
        common = dict(recipe=self.recipe, dtype=self.dtype)
        qkv, _ = LayerNormDenseGeneral(3 * self.hidden, use_bias=True, name="ln_qkv", **common)(x)
        x = x + DenseGeneral(self.hidden, name="out", **common)(_attention(qkv, self.heads))
        y, _ = LayerNormMLP(intermediate_dim=self.ffn, activations=("gelu",), name="ln_mlp",
                            **common)(x)
        return x + y


def make_layer(variant: str, hidden: int, ffn: int, heads: int) -> nn.Module:
    seed = functools.partial(SeedLayer, hidden, ffn, heads)
    if variant == "bf16":
        return seed()
    if variant == "flax_fp8":
        return seed(dot_general_cls=fp8_ops.Fp8DotGeneral)
    if variant in ("qmesh_delayed", "qmesh_delayed_quiet"):
        return seed(dot_general_cls=make_dot_general_cls(DelayedScaling()))
    if variant == "qmesh_current":
        return seed(dot_general_cls=make_dot_general_cls(Float8CurrentScaling()))
    if variant == "qmesh_modules":
        return QmeshModulesLayer(hidden, ffn, heads, DelayedScaling())
    raise ValueError(f"unknown variant {variant!r}; one of {VARIANTS}")


def make_step(model: nn.Module):
    """jitted (variables, x) -> (loss, parameter gradients, variables of the next step)."""

    def loss_fn(v, x):
        return jnp.mean(jnp.square(model.apply(v, x).astype(jnp.float32)))

    @jax.jit
    def step(v, x):
        loss, grads = jax.value_and_grad(loss_fn)(v, x)
        nxt = dict(v)
        if STATE in grads:  # the updated FP8 state comes back as its gradient
            nxt[STATE] = grads[STATE]
        return loss, grads["params"], nxt

    return step


def state_advanced(before, after) -> bool | None:
    """Whether every amax history in the FP8 state changed (None: the variant has no state)."""
    if STATE not in before:
        return None
    pairs = [(b, a) for (p, b), a in zip(jax.tree_util.tree_leaves_with_path(before[STATE]),
                                         jax.tree.leaves(after[STATE]))
             if "amax_history" in jax.tree_util.keystr(p)]
    return bool(pairs) and all(not np.array_equal(np.asarray(b), np.asarray(a)) for b, a in pairs)


def run(variant: str, x, hidden, ffn, heads, warmup, steps, hlo_dir=None, cudart=None,
        profile_steps=0) -> dict:
    """Compiles, warms up and times one variant; then, given a CUDA runtime (load_cudart),
    runs profile_steps more steps between its cudaProfilerStart and cudaProfilerStop."""
    model = make_layer(variant, hidden, ffn, heads)
    v = model.init(jax.random.key(0), x)
    reporting = delayed_state.reporting()
    delayed_state.set_reporting(reporting and variant != "qmesh_delayed_quiet")
    try:
        step = make_step(model).lower(v, x).compile()  # compiled once: its HLO is the one timed
    finally:
        delayed_state.set_reporting(reporting)
    hlo = step.as_text()
    if hlo_dir:
        os.makedirs(hlo_dir, exist_ok=True)
        with open(os.path.join(hlo_dir, f"{variant}.hlo.txt"), "w") as f:
            f.write(hlo)
    first = v
    for _ in range(warmup):
        loss, _, v = jax.block_until_ready(step(v, x))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss, _, v = jax.block_until_ready(step(v, x))
        times.append(time.perf_counter() - start)
    if cudart is not None and profile_steps:
        with profiled(cudart):
            for _ in range(profile_steps):
                loss, _, v = jax.block_until_ready(step(v, x))
    return dict(variant=variant, mean_ms=1e3 * float(np.mean(times)),
                median_ms=1e3 * float(np.median(times)), min_ms=1e3 * float(np.min(times)),
                steps=steps, profiled_steps=profile_steps if cudart is not None else 0,
                loss=float(loss), state_advanced=state_advanced(first, v),
                **fp8_gemm_counts(hlo))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=1,
                   help="divide seq, hidden, ffn and heads by this (heads at least 1); e.g. 32 "
                        "on the CPU")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after compiling")
    p.add_argument("--steps", type=int, default=20, help="timed steps (>= 20 for a number to report)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--json", help="write the results to this file")
    p.add_argument("--hlo-dir", help="write each variant's optimized HLO into this folder")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the timed steps, run this many more between cudaProfilerStart "
                        "and cudaProfilerStop (for ncu --profile-from-start off); nothing is "
                        "profiled where JAX runs on no CUDA GPU")
    p.add_argument("--require-state", action="store_true",
                   help="exit 1 unless every stateful variant's amax histories advanced")
    args = p.parse_args(argv)
    if (args.scale < 1 or args.batch < 1 or args.steps < 1 or args.warmup < 0
            or args.profile_steps < 0):
        p.error("--scale, --batch and --steps must be >= 1, --warmup and --profile-steps >= 0")
    variants = [s for s in args.variants.split(",") if s]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {','.join(VARIANTS)}")
    s = args.scale
    seq, hidden, ffn, heads = 2048 // s, 4096 // s, 16384 // s, max(1, 32 // s)
    if min(seq, hidden, ffn) < 1 or hidden % heads:
        p.error(f"--scale {s} leaves no layer (seq {seq}, hidden {hidden}, heads {heads})")
    x = jnp.asarray(np.random.default_rng(0).standard_normal((args.batch, seq, hidden)),
                    jnp.bfloat16)
    device = jax.devices()[0]
    print(f"Flax transformer layer fwd+bwd, jit on {device.platform} ({device.device_kind}), "
          f"jax {jax.__version__}: batch {args.batch}, seq {seq}, hidden {hidden}, ffn {ffn}, "
          f"heads {heads}, bf16; {args.steps} steps after {args.warmup} warm-up")
    cudart = None
    if args.profile_steps and device.platform != "gpu":
        print(f"--profile-steps: JAX runs on {device.platform}, which launches no CUDA kernels; "
              "no steps profiled")
    elif args.profile_steps:
        try:
            cudart = load_cudart()
        except RuntimeError as e:
            p.error(f"--profile-steps: {e}")
    results = []
    for variant in variants:
        r = run(variant, x, hidden, ffn, heads, args.warmup, args.steps, args.hlo_dir, cudart,
                args.profile_steps)
        results.append(r)
        print(f"  {variant:14s} mean {r['mean_ms']:9.3f} ms  median {r['median_ms']:9.3f} ms  "
              f"FP8 GEMMs: XLA {r['xla_fp8_gemms']}, qmesh {r['qmesh_fp8_gemms']}  "
              f"loss {r['loss']:.5g}", flush=True)
    by = {r["variant"]: r for r in results}
    for r in results:
        for base in ("bf16", "flax_fp8"):
            if base in by:
                r[f"speedup_vs_{base}"] = by[base]["median_ms"] / r["median_ms"]
    print("\n| variant | mean ms | median ms | vs bf16 | vs flax_fp8 | XLA FP8 GEMMs | qmesh FP8 GEMMs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratio = lambda k: f"{r[k]:.2f}x" if k in r else "-"  # noqa: E731
        print(f"| {r['variant']} | {r['mean_ms']:.3f} | {r['median_ms']:.3f} | "
              f"{ratio('speedup_vs_bf16')} | {ratio('speedup_vs_flax_fp8')} | "
              f"{r['xla_fp8_gemms']} | {r['qmesh_fp8_gemms']} |")
    if "flax_fp8" in by and by["flax_fp8"]["xla_fp8_gemms"] == 0:
        print(f"note: XLA made no FP8 GEMM of Flax's Fp8DotGeneral on {device.platform}: its "
              "'FP8' run computes in bf16/f32 after quantize-dequantize"
              + (" (expected on the CPU)" if device.platform == "cpu" else ""))
    stale = [r["variant"] for r in results if r["state_advanced"] is False]
    if stale:
        print(f"WARNING: the amax histories did not advance in {stale}")
    if args.json:
        meta = dict(platform=device.platform, device_kind=device.device_kind, jax=jax.__version__,
                    machine=platform.machine(), batch=args.batch, seq=seq, hidden=hidden, ffn=ffn,
                    heads=heads, scale=s, warmup=args.warmup, steps=args.steps,
                    profile_steps=args.profile_steps,
                    date=time.strftime("%Y-%m-%d"))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)
        print(f"wrote {args.json}")
    return 1 if args.require_state and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
