#!/usr/bin/env python3
"""Summarizes the Nsight Compute CSVs of launch/gpu_check.sh's profile step as JSON.

Usage: ncu_summary.py OUT_DIR  (reads OUT_DIR/ncu-cast.csv, OUT_DIR/ncu-norm.csv and
OUT_DIR/ncu-step-*.csv, prints JSON to stdout)

ncu-cast.csv, ncu-norm.csv: `ncu --section ... --csv` of the cast kernel and of the
norm_forward kernel: every metric of every profiled launch, by section. ncu-step-RECIPE.csv: `ncu --metrics gpu__time_duration.sum --csv` of
dense_gpu_bench --iters 1 (3 steps: 2 warm-up, 1 timed): the kernels' serialized durations,
split into GEMM kernels (cuBLASLt's) and the rest, per step.
"""
import csv
import glob
import json
import os
import re
import sys

GEMM = re.compile(r"gemm|xmma|cutlass|nvjet|splitk|matmul", re.IGNORECASE)
TO_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}
STEPS = 3  # dense_gpu_bench --iters 1: 2 warm-up steps and 1 timed


def rows(path):
    """The CSV rows after ncu's header row (the program's own output before it is skipped)."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return []
    return list(csv.DictReader(lines[start:]))


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def cast_kernels(path):
    launches = {}
    for r in rows(path):
        launch = launches.setdefault(r["ID"], {
            "kernel": r.get("Kernel Name", ""), "grid": r.get("Grid Size", ""),
            "block": r.get("Block Size", ""), "sections": {}})
        section = launch["sections"].setdefault(r.get("Section Name", ""), {})
        unit = r.get("Metric Unit", "")
        section[r["Metric Name"] + (f" [{unit}]" if unit else "")] = number(r["Metric Value"])
    return list(launches.values())


def kernel_times(path):
    """(kernel name, ms) of every launch in a `--metrics gpu__time_duration.sum --csv` file."""
    for r in rows(path):
        value = number(r.get("Metric Value", ""))
        if r.get("Metric Name") == "gpu__time_duration.sum" and isinstance(value, float):
            yield r.get("Kernel Name", ""), value * TO_MS.get(r.get("Metric Unit", "nsecond"), 1e-6)


def step_split(path):
    gemm = other = 0.0
    by_kernel = {}
    for name, ms in kernel_times(path):
        if GEMM.search(name):
            gemm += ms
        else:
            other += ms
            short = name.split("(")[0][:80]
            by_kernel[short] = by_kernel.get(short, 0.0) + ms
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:10]
    return {"gemm_ms_per_step": gemm / STEPS, "other_ms_per_step": other / STEPS,
            "gemm_share": gemm / (gemm + other) if gemm + other else 0.0,
            "top_other_kernels_ms_per_step": [{"kernel": k, "ms": v / STEPS} for k, v in top]}


def main():
    out = sys.argv[1]
    summary = {}
    for name, key in (("ncu-cast.csv", "cast_transpose_8192x8192"),
                      ("ncu-norm.csv", "norm_forward_8192x4096")):
        path = os.path.join(out, name)
        if os.path.exists(path):
            summary[key] = cast_kernels(path)
    for path in sorted(glob.glob(os.path.join(out, "ncu-step-*.csv"))):
        recipe = os.path.basename(path)[len("ncu-step-"):-len(".csv")]
        summary.setdefault("layer_norm_mlp_step", {})[recipe] = step_split(path)
    json.dump(summary, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
