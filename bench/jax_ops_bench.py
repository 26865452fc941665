#!/usr/bin/env python3
"""Times each qmesh.jax primitive against its pure-JAX equivalent, both under jax.jit on one
device (the first of the default backend: CPU here, a GPU when there is one). Prints a table
and, with --json, writes the numbers.

    QMESH_JAX_LIBRARY_DIR=build/src PYTHONPATH=python build/venv/bin/python \\
        bench/jax_ops_bench.py --rows 4096 --cols 4096 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import qmesh.jax as qj
from qmesh.jax.gemm import Epilogue, gemm
from qmesh.jax.layer_norm import layer_norm_fwd, layer_norm_fwd_quantize
from qmesh.jax.recipe import DelayedScaling
from qmesh.jax.scaling import update_delayed_scaling

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def cast(x, scale, dtype):
    m = float(jnp.finfo(dtype).max)
    return jnp.clip(x * scale, -m, m).astype(dtype)


def jax_quantize(x, scale):
    return cast(x, scale, E4M3), jnp.max(jnp.abs(x)), 1.0 / scale


def jax_quantize_current(x):
    a = jnp.max(jnp.abs(x))
    s = jnp.where(a > 0, 448.0 / a, 1.0)
    return cast(x, s, E4M3), cast(x.T, s, E4M3), a, s


def jax_layer_norm(x, g, b, eps=1e-5):
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * g + b


def jax_delayed_update(h, s, margin=0.0):
    a = jnp.max(h, axis=0)
    new = jnp.where((a > 0) & jnp.isfinite(a), 448.0 / a / 2.0**margin, s)
    rolled = jnp.roll(h, -1, axis=0).at[0].set(0.0)
    return rolled, new


def cases(rows, cols, n, history_len, groups):
    """(name, qmesh fn, pure-JAX fn, args, bytes moved by the op): the same work in both."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, cols)), jnp.float32)
    xb = x.astype(jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((n, cols)), jnp.float32)
    s = jnp.float32(16.0)
    q = qj.quantize(x, s).q
    qw = qj.quantize(w, s).q
    si = jnp.float32(1 / 16)
    g, b = jnp.ones(cols, jnp.float32), jnp.zeros(cols, jnp.float32)
    sizes = np.full(groups, rows // groups, np.int32)
    sizes[-1] += rows - sizes.sum()
    scales = jnp.full(groups, 16.0, jnp.float32)
    hist = jnp.asarray(rng.uniform(0.1, 10, (history_len, 1000)), jnp.float32)
    hs = jnp.ones(1000, jnp.float32)
    elems = rows * cols
    flops = 2.0 * rows * cols * n

    def jax_grouped(x, scales):
        bounds = np.cumsum(sizes)[:-1]
        parts = jnp.split(x, bounds)
        return [cast(p, sc, E4M3) for p, sc in zip(parts, scales)], [jnp.max(jnp.abs(p)) for p in parts]

    return [
        ("amax f32", qj.amax, lambda v: jnp.max(jnp.abs(v)), (x,), 4 * elems, None),
        ("quantize f32->e4m3", lambda v, s: tuple(qj.quantize(v, s)), jax_quantize, (x, s), 5 * elems, None),
        ("quantize bf16->e4m3", lambda v, s: tuple(qj.quantize(v, s)), jax_quantize, (xb, s), 3 * elems, None),
        ("quantize_current +columnwise", lambda v: tuple(qj.quantize_current(v, columnwise=True)),
         jax_quantize_current, (x,), 6 * elems, None),
        ("dequantize e4m3->f32", qj.dequantize, lambda q, si: q.astype(jnp.float32) * si, (q, si),
         5 * elems, None),
        ("dbias_quantize f32->e5m2", lambda v, s: qj.dbias_quantize(v, s),
         lambda v, s: (cast(v, s, E5M2), jnp.max(jnp.abs(v)), jnp.sum(v, 0)), (x, s), 5 * elems, None),
        (f"grouped_quantize {groups} groups",
         lambda v, sc: tuple(qj.grouped_quantize(v, sizes, sc)), jax_grouped, (x, scales), 5 * elems, None),
        ("layer_norm fwd", lambda v: layer_norm_fwd(v, g, b), lambda v: jax_layer_norm(v, g, b), (x,),
         8 * elems, None),
        ("layer_norm fwd+quantize", lambda v: layer_norm_fwd_quantize(v, g, b, s)[1].q,
         lambda v: cast(jax_layer_norm(v, g, b), s, E4M3), (x,), 9 * elems, None),
        (f"delayed update 1000 x {history_len}",
         lambda h, sc: update_delayed_scaling(h, sc, [E4M3] * 1000, DelayedScaling(amax_history_len=history_len)),
         jax_delayed_update, (hist, hs), 8 * hist.size, None),
        (f"gemm e4m3 {rows}x{cols}x{n}", lambda a, b: gemm(a, b, si, si),
         lambda a, b: jnp.matmul(a.astype(jnp.float32) * si, (b.astype(jnp.float32) * si).T),
         (q, qw), None, flops),
        (f"gemm bf16 {rows}x{cols}x{n}", lambda a, b: gemm(a, b, out_dtype=jnp.bfloat16),
         lambda a, b: jnp.matmul(a, b.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16),
         (xb, w.astype(jnp.bfloat16)), None, flops),
    ]


def timed(fn, args, warmup, iters):
    """Median seconds per call of the jitted fn (results blocked on)."""
    f = jax.jit(fn)
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2048, help="rows (tokens) of the activation x")
    p.add_argument("--cols", type=int, default=2048, help="columns (hidden size) of x, the GEMMs' K")
    p.add_argument("--n", type=int, default=2048, help="N of the GEMMs (weight rows)")
    p.add_argument("--groups", type=int, default=8, help="groups of grouped_quantize")
    p.add_argument("--history", type=int, default=1024, help="amax history length of the update")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    p.add_argument("--json", help="write the results to this file")
    args = p.parse_args()
    for name in ("rows", "cols", "n", "groups", "history", "iters"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.rows < args.groups:
        p.error("--rows must be >= --groups")

    device = jax.devices()[0]
    print(f"qmesh.jax ops vs pure JAX, jit on {device.platform} ({device.device_kind}), "
          f"jax {jax.__version__}, median of {args.iters}")
    print(f"{'op':36} {'qmesh ms':>10} {'JAX ms':>10} {'speed-up':>9} {'qmesh GB/s|TFLOP/s':>19}")
    results = []
    for name, ours, theirs, inputs, nbytes, flops in cases(args.rows, args.cols, args.n, args.history,
                                                             args.groups):
        if args.only and args.only not in name:
            continue
        t_q = timed(ours, inputs, args.warmup, args.iters)
        t_j = timed(theirs, inputs, args.warmup, args.iters)
        rate = nbytes / t_q / 1e9 if nbytes else flops / t_q / 1e12
        unit = "GB/s" if nbytes else "TFLOP/s"
        print(f"{name:36} {t_q * 1e3:10.3f} {t_j * 1e3:10.3f} {t_j / t_q:8.2f}x {rate:12.2f} {unit}",
              flush=True)
        results.append(dict(op=name, qmesh_s=t_q, jax_s=t_j, speedup=t_j / t_q, rate=rate, unit=unit))
    if args.json:
        meta = dict(platform=device.platform, device_kind=device.device_kind,
                    local_devices=jax.local_device_count(), host_cpus=os.cpu_count(),
                    jax=jax.__version__, machine=platform.machine(), rows=args.rows, cols=args.cols,
                    n=args.n, iters=args.iters, date=time.strftime("%Y-%m-%d"))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
