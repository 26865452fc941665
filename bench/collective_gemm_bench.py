#!/usr/bin/env python3
"""Forward + backward of a sequence-parallel LayerNormMLP (qmesh.jax.mlp.layernorm_mlp,
DelayedScaling, float32) on a dp x tp mesh of CPU devices in one process (or, with
--platform gpu, of this process's first dp x tp GPUs: the rings then run on NCCL), with and
without the collective GEMM option:

  xla    collective_gemm=None: XLA all-gathers fc1's input codes and reduce-scatters fc2's
         product (and the mirror images in backward)
  none   the rings' unoverlapped schedule (gather, then the chunk GEMMs; the chunk GEMMs, then
         the ring sum) through qmesh's handlers
  ring   all-gather + GEMM and GEMM + reduce-scatter rings, each transfer beside a GEMM
  bidir  the all-gather ring in both directions

x is [dp, seq, hidden] sharded (dp, tp) over (batch, seq); fc1 [hidden, ffn] column parallel,
fc2 [ffn, hidden] row parallel. Each variant is compiled, run --warmup times, then --steps
times, each step waited for; the table gives the median and the minimum step time and the
ratio to xla. The optimized HLO of each variant is searched for all-gather, reduce-scatter and
the ring calls.

    PYTHONPATH=python QMESH_JAX_LIBRARY_DIR=build/src python bench/collective_gemm_bench.py \\
        --tp 4 --dp 2 --json out.json
    ... bench/collective_gemm_bench.py --platform gpu --tp 1 --seq 8192 --hidden 4096 \
        --ffn 16384        # one GPU: the one-rank NCCL path against XLA's
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time


def parse(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--platform",
        choices=("cpu", "gpu"),
        default="cpu",
        help="the devices of the mesh (gpu: the first dp x tp GPUs)",
    )
    p.add_argument("--tp", type=int, default=4, help="tensor/sequence-parallel axis size")
    p.add_argument("--dp", type=int, default=1, help="data-parallel axis size")
    p.add_argument("--seq", type=int, default=512, help="tokens per sequence")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--variants", default="xla,none,ring,bidir", help="comma-separated")
    p.add_argument("--json", help="write the results to this file")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    devices = args.dp * args.tp
    if args.platform == "cpu":
        os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={devices}")
    import jax

    if args.platform == "cpu":
        jax.config.update("jax_num_cpu_devices", devices)
    try:
        mesh_devices = jax.devices(args.platform)
    except RuntimeError:
        mesh_devices = []
    if len(mesh_devices) < devices:
        print(
            f"collective_gemm_bench: dp x tp = {devices} {args.platform} devices needed, "
            f"{len(mesh_devices)} seen: lower --dp/--tp",
            file=sys.stderr,
        )
        return 2
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    import qmesh.jax as qj
    from qmesh.jax.dense import init_state

    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "jax")
    )
    from sp_mlp import X_SPEC, place, place_layer, sp_layernorm_mlp

    mesh = jax.make_mesh(
        (args.dp, args.tp),
        ("dp", "tp"),
        axis_types=(AxisType.Auto,) * 2,
        devices=mesh_devices[:devices],
    )
    resource = qj.MeshResource(dp_resource="dp", tp_resource="tp", tpsp_resource="tp")
    rng = np.random.default_rng(0)
    h, f = args.hidden, args.ffn
    recipe = qj.DelayedScaling()

    def make_step(cg):
        def loss(x, gamma, beta, kernels, biases, states):
            y, _ = sp_layernorm_mlp(
                x, gamma, beta, kernels, biases, states, recipe=recipe, collective_gemm=cg
            )
            return jnp.mean(y * y)

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 3, 4, 5)))

    results = []
    with jax.set_mesh(mesh), qj.global_shard_guard(resource):
        x = place(mesh, rng.standard_normal((args.dp, args.seq, h)), X_SPEC)
        gamma, beta = place(mesh, np.ones(h), P()), place(mesh, np.zeros(h), P())
        kernels = (
            rng.standard_normal((h, f)) / np.sqrt(h),
            rng.standard_normal((f, h)) / np.sqrt(f),
        )
        kernels, biases = place_layer(mesh, kernels, (np.zeros(f), np.zeros(h)))
        for variant in args.variants.split(","):
            cg = None if variant == "xla" else variant
            step = make_step(cg)
            states = (init_state(recipe), init_state(recipe))
            hlo = step.lower(x, gamma, beta, kernels, biases, states).compile().as_text()
            times = []
            for i in range(args.warmup + args.steps):
                start = time.perf_counter()
                out = jax.block_until_ready(step(x, gamma, beta, kernels, biases, states))
                if i >= args.warmup:
                    times.append(time.perf_counter() - start)
                states = out[1][3]
            results.append(
                {
                    "variant": variant,
                    "median_ms": 1e3 * float(np.median(times)),
                    "min_ms": 1e3 * float(np.min(times)),
                    "all_gathers": hlo.count(" all-gather(") + hlo.count(" all-gather-start("),
                    "reduce_scatters": hlo.count(" reduce-scatter("),
                    "ring_calls": hlo.count("qmesh_all_gather_gemm")
                    + hlo.count("qmesh_gemm_reduce_scatter"),
                }
            )
    base = next((r["median_ms"] for r in results if r["variant"] == "xla"), None)
    print(
        f"LayerNormMLP fwd+bwd, dp={args.dp} tp={args.tp}, x [{args.dp}, {args.seq}, {h}], "
        f"ffn {f}, {args.steps} steps, {platform.node()} ({os.cpu_count()} cores), "
        f"{mesh_devices[0].device_kind}"
    )
    print("| variant | median ms | min ms | vs xla | all-gather | reduce-scatter | ring calls |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratio = f"{base / r['median_ms']:.2f}x" if base else "-"
        print(
            f"| {r['variant']} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | {ratio} | "
            f"{r['all_gathers']} | {r['reduce_scatters']} | {r['ring_calls']} |"
        )
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k != "json"}
        meta.update(jax=jax.__version__, cores=os.cpu_count(), device=mesh_devices[0].device_kind)
        with open(args.json, "w") as out:
            json.dump({"config": meta, "results": results}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
