#!/usr/bin/env python3
"""Where the kernel time of the Flax transformer layer step goes, per kernel category, from
Nsight Compute CSVs of bench/flax_layer_bench.py --profile-steps (launch/gpu_check.sh jax):

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        python3 bench/flax_layer_bench.py --variants VARIANT --profile-steps 1 ... \\
        >ncu-flax-VARIANT.csv
    launch/ncu_layer_summary.py --steps 1 --json ncu-flax.json ncu-flax-*.csv

Each file's variant is its name between "ncu-flax-" and ".csv". The durations are ncu's
serialized kernel times (one kernel at a time, no overlap, no launch gaps), so their sum
is the step's kernel time, not its wall time. Every kernel falls into the first category
whose rule its name matches (ncu prints demangled names, parameters included):

    qmesh       qmesh's own kernels (namespace qmesh::, mangled 5qmesh)
    attention   fused attention and softmax kernels (fmha, flash, sdpa, softmax, attention);
                XLA's unfused attention is GEMMs and fusions and is counted there
    gemm        GEMMs: cuBLAS/cuBLASLt (with their split-K and epilogue helper kernels),
                CUTLASS, XLA's Triton GEMM fusions (ncu_summary.GEMM, and cublas)
    copy        copies and transposes (copy, transpose, memcpy)
    xla_fusion  XLA's other generated kernels (loop_/input_ fusions, wrapped_ ops, triton)
    other       the rest

Prints a table and writes JSON: per variant the kernel ms per step in total and per
category, the launches per step, and the ten costliest kernels.
"""

import argparse
import json
import os
import re
import sys

from ncu_summary import GEMM, kernel_times

CATEGORIES = (
    ("qmesh", re.compile(r"qmesh::|5qmesh")),
    ("attention", re.compile(r"fmha|flash|sdpa|softmax|attention", re.IGNORECASE)),
    ("gemm", re.compile(GEMM.pattern + "|cublas", re.IGNORECASE)),
    ("copy", re.compile(r"copy|transpose|memcpy", re.IGNORECASE)),
    ("xla_fusion", re.compile(r"fusion|^loop_|^input_|^wrapped_|triton", re.IGNORECASE)),
    ("other", re.compile("")),
)
TOP = 10


def category(name):
    """The first category whose rule matches the kernel name."""
    return next(c for c, rule in CATEGORIES if rule.search(name))


def short_name(name):
    """The kernel name without its return type and parameter list."""
    name = name.strip()
    if name.endswith(")"):  # cut the parameter list: the last balanced (...) group
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name.removeprefix("void ").strip()


def summarize(path, steps):
    """Kernel ms per step of one CSV: in total, per category, and the costliest kernels."""
    per_category = dict.fromkeys((c for c, _ in CATEGORIES), 0.0)
    per_kernel = {}
    launches = 0
    for name, ms in kernel_times(path):
        launches += 1
        kind = category(name)
        per_category[kind] += ms
        entry = per_kernel.setdefault(short_name(name), [kind, 0, 0.0])
        entry[1] += 1
        entry[2] += ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][2])[:TOP]
    return {
        "steps": steps,
        "launches_per_step": launches / steps,
        "total_ms_per_step": sum(per_category.values()) / steps,
        "ms_per_step": {c: ms / steps for c, ms in per_category.items()},
        "top_kernels": [
            {"kernel": k, "category": c, "launches_per_step": n / steps, "ms_per_step": ms / steps}
            for k, (c, n, ms) in top
        ],
    }


def variant_of(path):
    name = os.path.basename(path)
    if not (name.startswith("ncu-flax-") and name.endswith(".csv")):
        raise ValueError(f"{path}: expected a file named ncu-flax-VARIANT.csv")
    return name[len("ncu-flax-") : -len(".csv")]


def table(summary):
    """A markdown table of the categories' ms per step, one row per variant."""
    names = [c for c, _ in CATEGORIES]
    lines = [
        "| variant | kernels ms/step | " + " | ".join(names) + " | launches/step |",
        "|---|" + "---:|" * (len(names) + 2),
    ]
    for variant, s in summary.items():
        cells = [f"{s['ms_per_step'][c]:.3f}" for c in names]
        lines.append(
            f"| {variant} | {s['total_ms_per_step']:.3f} | "
            + " | ".join(cells)
            + f" | {s['launches_per_step']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("csvs", nargs="+", metavar="ncu-flax-VARIANT.csv")
    p.add_argument(
        "--steps", type=int, default=1, help="profiled steps in each file (--profile-steps)"
    )
    p.add_argument("--json", help="write the summary to this file")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    summary = {}
    for path in args.csvs:
        try:
            variant = variant_of(path)
        except ValueError as e:
            p.error(str(e))
        summary[variant] = summarize(path, args.steps)
        if not summary[variant]["launches_per_step"]:
            print(
                f"ncu_layer_summary: {path} has no gpu__time_duration.sum rows (did ncu run, "
                "and did the program reach cudaProfilerStart? see the ncu log)",
                file=sys.stderr,
            )
    print(table(summary))
    for variant, s in summary.items():
        print(f"\n{variant}: the {TOP} costliest kernels (ms per step)")
        for k in s["top_kernels"]:
            print(
                f"  {k['ms_per_step']:8.3f}  {k['category']:10s} x{k['launches_per_step']:<4g} "
                f"{k['kernel'][:100]}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(s["launches_per_step"] for s in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
