#!/usr/bin/env python3
"""Times each qmesh.jax primitive against its pure-JAX equivalent, both under jax.jit on one
device (the first of the default backend: CPU here, a GPU when there is one). Prints a table
and, with --json, writes the numbers.

Device time, not one dispatch per sample: a sample dispatches --reps calls of the jitted op
back to back without waiting (JAX dispatches asynchronously, the device runs the calls in
order), waits for the last, and divides the elapsed time by --reps; the table shows the
median of --iters samples. An op shorter than one dispatch (tens of microseconds) is then
timed by its dispatch.

The GEMMs write a bf16 D, as gemm_gpu_bench does (the FP8 GEMM an fp32 D too); --gemm MxNxK
adds GEMM shapes (gemm_gpu_bench's are 8192x8192x8192, 8192x12288x4096, 8192x4096x4096,
8192x16384x4096, 8192x4096x16384). For the plain-JAX FP8 GEMM the table says whether XLA made
an FP8 cuBLASLt GEMM of it (column xla-fp8).

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
from hlo_gemms import fp8_gemm_counts
from qmesh.jax.gemm import gemm
from qmesh.jax.layer_norm import layer_norm_fwd, norm_fwd_quantize
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


def jax_rms_norm(x, g, eps=1e-5):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps) * g).astype(x.dtype)


def jax_delayed_update(h, s, margin=0.0):
    a = jnp.max(h, axis=0)
    new = jnp.where((a > 0) & jnp.isfinite(a), 448.0 / a / 2.0**margin, s)
    rolled = jnp.roll(h, -1, axis=0).at[0].set(0.0)
    return rolled, new


def jax_quantize_columnwise(x, scale):
    return cast(x, scale, E4M3), cast(x.T, scale, E4M3), jnp.max(jnp.abs(x)), 1.0 / scale


def gemm_cases(m, n, k, fp8_out_dtypes=(jnp.bfloat16,)):
    """FP8 (e4m3 x e4m3, TN) and bf16 GEMMs D [m, n] = A [m, k] . B [n, k]^T, qmesh's against
    XLA's dot on the same dequantized operands (which XLA's GPU compiler turns into an FP8
    cuBLASLt GEMM when it matches its pattern)."""
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
    s, si = jnp.float32(16.0), jnp.float32(1 / 16)
    qa, qb = qj.quantize(a, s).q, qj.quantize(b, s).q
    flops = 2.0 * m * n * k
    out = []
    for d in fp8_out_dtypes:
        name = jnp.dtype(d).name.replace("float32", "f32").replace("bfloat16", "bf16")
        out.append((f"gemm e4m3->{name} {m}x{n}x{k}",
                    lambda x, y, d=d: gemm(x, y, si, si, out_dtype=d),
                    lambda x, y, d=d: jnp.matmul(x.astype(jnp.float32) * si,
                                                 (y.astype(jnp.float32) * si).T).astype(d),
                    (qa, qb), None, flops))
    out.append((f"gemm bf16->bf16 {m}x{n}x{k}", lambda x, y: gemm(x, y, out_dtype=jnp.bfloat16),
                lambda x, y: jnp.matmul(x, y.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16),
                (a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)), None, flops))
    return out


def cases(rows, cols, n, history_len, groups):
    """(name, qmesh fn, pure-JAX fn, args, bytes moved by the op, flops): the same work in
    both."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, cols)), jnp.float32)
    xb = x.astype(jnp.bfloat16)
    s = jnp.float32(16.0)
    q = qj.quantize(x, s).q
    si = jnp.float32(1 / 16)
    g, b = jnp.ones(cols, jnp.float32), jnp.zeros(cols, jnp.float32)
    sizes = np.full(groups, rows // groups, np.int32)
    sizes[-1] += rows - sizes.sum()
    scales = jnp.full(groups, 16.0, jnp.float32)
    hist = jnp.asarray(rng.uniform(0.1, 10, (history_len, 1000)), jnp.float32)
    hs = jnp.ones(1000, jnp.float32)
    elems = rows * cols

    def jax_grouped(x, scales):
        bounds = np.cumsum(sizes)[:-1]
        parts = jnp.split(x, bounds)
        return [cast(p, sc, E4M3) for p, sc in zip(parts, scales)], [jnp.max(jnp.abs(p)) for p in parts]

    def jax_dbias_quantize(v, s):
        return cast(v, s, E5M2), jnp.max(jnp.abs(v)), jnp.sum(v.astype(jnp.float32), 0)

    return [
        ("amax f32", qj.amax, lambda v: jnp.max(jnp.abs(v)), (x,), 4 * elems, None),
        ("amax bf16", qj.amax, lambda v: jnp.max(jnp.abs(v)), (xb,), 2 * elems, None),
        ("quantize f32->e4m3", lambda v, s: tuple(qj.quantize(v, s)), jax_quantize, (x, s), 5 * elems, None),
        ("quantize bf16->e4m3", lambda v, s: tuple(qj.quantize(v, s)), jax_quantize, (xb, s), 3 * elems, None),
        ("quantize f32->e5m2", lambda v, s: tuple(qj.quantize(v, s, E5M2)),
         lambda v, s: (cast(v, s, E5M2), jnp.max(jnp.abs(v)), 1.0 / s), (x, s), 5 * elems, None),
        ("quantize bf16->e5m2", lambda v, s: tuple(qj.quantize(v, s, E5M2)),
         lambda v, s: (cast(v, s, E5M2), jnp.max(jnp.abs(v)), 1.0 / s), (xb, s), 3 * elems, None),
        ("quantize f32->e4m3 +columnwise", lambda v, s: tuple(qj.quantize(v, s, columnwise=True)),
         jax_quantize_columnwise, (x, s), 6 * elems, None),
        ("quantize bf16->e4m3 +columnwise", lambda v, s: tuple(qj.quantize(v, s, columnwise=True)),
         jax_quantize_columnwise, (xb, s), 4 * elems, None),
        ("quantize_current +columnwise", lambda v: tuple(qj.quantize_current(v, columnwise=True)),
         jax_quantize_current, (x,), 6 * elems, None),
        ("dequantize e4m3->f32", qj.dequantize, lambda q, si: q.astype(jnp.float32) * si, (q, si),
         5 * elems, None),
        ("dbias_quantize f32->e5m2", lambda v, s: qj.dbias_quantize(v, s), jax_dbias_quantize,
         (x, s), 5 * elems, None),
        ("dbias_quantize bf16->e5m2", lambda v, s: qj.dbias_quantize(v, s), jax_dbias_quantize,
         (xb, s), 3 * elems, None),
        (f"grouped_quantize {groups} groups",
         lambda v, sc: tuple(qj.grouped_quantize(v, sizes, sc)), jax_grouped, (x, scales), 5 * elems, None),
        ("layer_norm fwd", lambda v: layer_norm_fwd(v, g, b), lambda v: jax_layer_norm(v, g, b), (x,),
         8 * elems, None),
        ("layer_norm fwd+quantize", lambda v: norm_fwd_quantize(v, g, b, s)[1].q,
         lambda v: cast(jax_layer_norm(v, g, b), s, E4M3), (x,), 9 * elems, None),
        ("layer_norm fwd+quantize bf16", lambda v: norm_fwd_quantize(v, g, b, s)[1].q,
         lambda v: cast(jax_layer_norm(v.astype(jnp.float32), g, b).astype(v.dtype), s, E4M3), (xb,),
         5 * elems, None),
        ("rms_norm fwd+quantize bf16", lambda v: norm_fwd_quantize(v, g, None, s)[1].q,
         lambda v: cast(jax_rms_norm(v, g), s, E4M3), (xb,), 5 * elems, None),
        (f"delayed update 1000 x {history_len}",
         lambda h, sc: update_delayed_scaling(h, sc, [E4M3] * 1000, DelayedScaling(amax_history_len=history_len)),
         jax_delayed_update, (hist, hs), 8 * hist.size, None),
        *gemm_cases(rows, n, cols, (jnp.bfloat16, jnp.float32)),
    ]


def timed(fn, args, warmup, iters, reps, hlo=False):
    """(median seconds per call of jitted fn, its optimized HLO if asked): each of `iters` samples
    dispatches `reps` calls back to back without waiting (JAX dispatches asynchronously and
    the device runs them in order), waits once, and divides the elapsed time by `reps`."""
    f = jax.jit(fn)
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        for _ in range(reps):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t) / reps)
    return float(np.median(times)), f.lower(*args).compile().as_text() if hlo else None


def parse_gemm(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gemm takes MxNxK (e.g. 8192x8192x8192), not {text!r}")
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"--gemm {text}: every dimension must be >= 1")
    return m, n, k


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2048, help="rows (tokens) of the activation x")
    p.add_argument("--cols", type=int, default=2048, help="columns (hidden size) of x, the GEMMs' K")
    p.add_argument("--n", type=int, default=2048, help="N of the GEMMs (weight rows)")
    p.add_argument("--groups", type=int, default=8, help="groups of grouped_quantize")
    p.add_argument("--history", type=int, default=1024, help="amax history length of the update")
    p.add_argument("--gemm", type=parse_gemm, action="append", default=[], metavar="MxNxK",
                   help="also time the GEMMs at this shape (repeatable)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls after compiling")
    p.add_argument("--iters", type=int, default=5, help="timed calls (samples)")
    p.add_argument("--reps", type=int, default=10, help="calls dispatched per sample")
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    p.add_argument("--json", help="write the results to this file")
    args = p.parse_args()
    for name in ("rows", "cols", "n", "groups", "history", "iters", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.rows < args.groups:
        p.error("--rows must be >= --groups")

    device = jax.devices()[0]
    print(f"qmesh.jax ops vs pure JAX, jit on {device.platform} ({device.device_kind}), "
          f"jax {jax.__version__}, median of {args.iters} samples of {args.reps} back-to-back calls")
    print(f"{'op':40} {'qmesh ms':>10} {'JAX ms':>10} {'speed-up':>9} {'qmesh GB/s|TFLOP/s':>19} "
          f"{'xla-fp8':>7}")
    all_cases = cases(args.rows, args.cols, args.n, args.history, args.groups)
    for m, n, k in args.gemm:
        all_cases += gemm_cases(m, n, k)
    results = []
    for name, ours, theirs, inputs, nbytes, flops in all_cases:
        if args.only and args.only not in name:
            continue
        fp8_gemm = bool(flops) and "e4m3" in name
        t_q, _ = timed(ours, inputs, args.warmup, args.iters, args.reps)
        t_j, hlo_j = timed(theirs, inputs, args.warmup, args.iters, args.reps, hlo=fp8_gemm)
        rate = nbytes / t_q / 1e9 if nbytes else flops / t_q / 1e12
        unit = "GB/s" if nbytes else "TFLOP/s"
        xla_fp8 = fp8_gemm_counts(hlo_j)["xla_fp8_gemms"] if fp8_gemm else None
        print(f"{name:40} {t_q * 1e3:10.3f} {t_j * 1e3:10.3f} {t_j / t_q:8.2f}x {rate:12.2f} {unit:7} "
              f"{'' if xla_fp8 is None else xla_fp8:>5}", flush=True)
        results.append(dict(op=name, qmesh_s=t_q, jax_s=t_j, speedup=t_j / t_q, rate=rate, unit=unit,
                            jax_xla_fp8_gemms=xla_fp8))
    slower = [r["op"] for r in results if r["speedup"] < 1.0]
    print(f"qmesh slower than plain JAX (target >= 1.0x) in {len(slower)} of {len(results)}: "
          f"{', '.join(slower) or 'none'}")
    if args.json:
        meta = dict(platform=device.platform, device_kind=device.device_kind,
                    local_devices=jax.local_device_count(), host_cpus=os.cpu_count(),
                    jax=jax.__version__, machine=platform.machine(), rows=args.rows, cols=args.cols,
                    n=args.n, iters=args.iters, reps=args.reps, gemms=args.gemm,
                    timing="median of iters samples, each reps calls dispatched back to back / reps",
                    date=time.strftime("%Y-%m-%d"))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
