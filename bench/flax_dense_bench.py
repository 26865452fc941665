"""Forward+backward of one Dense of the seeds' shape (batch 4 x seq 2048, hidden 4096 ->
16384) with plain BF16, Flax's FP8 (flax.linen.fp8_ops.Fp8DotGeneral) and qmesh's drop-in
(make_dot_general_cls(DelayedScaling())), in one run on the default device; prints the times
and the ratios. --scale divides every dimension (use 8 or more on CPU).

    python bench/flax_dense_bench.py --scale 8 --repeat 3
"""

from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import fp8_ops

from qmesh.jax.flax import make_dot_general_cls
from qmesh.jax.recipe import DelayedScaling


def bench(model, x, repeat):
    v = model.init(jax.random.key(0), x)
    step = jax.jit(lambda v, x: jax.value_and_grad(
        lambda v_, x_: jnp.mean(model.apply(v_, x_).astype(jnp.float32) ** 2), argnums=(0, 1))(v, x))
    jax.block_until_ready(step(v, x))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(step(v, x))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=1, help="divide batch*seq and features by this")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    s = args.scale
    b, t, h, f = 4, 2048 // s, 4096 // s, 16384 // s
    x = jnp.asarray(np.random.default_rng(0).standard_normal((b, t, h)), jnp.bfloat16)
    runs = {
        "bf16": nn.Dense(f, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
        "flax_fp8": nn.Dense(f, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                             dot_general_cls=fp8_ops.Fp8DotGeneral),
        "qmesh_fp8": nn.Dense(f, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                              dot_general_cls=make_dot_general_cls(DelayedScaling())),
    }
    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), "
          f"x [{b}, {t}, {h}] bf16 -> {f}, median of {args.repeat}")
    ms = {name: bench(m, x, args.repeat) * 1e3 for name, m in runs.items()}
    for name, v in ms.items():
        print(f"  {name:10s} {v:10.2f} ms")
    print(f"  qmesh FP8 vs BF16: {ms['bf16'] / ms['qmesh_fp8']:.2f}x faster; "
          f"vs Flax FP8: {ms['flax_fp8'] / ms['qmesh_fp8']:.2f}x faster")


if __name__ == "__main__":
    main()
