#!/usr/bin/env python3
"""PyTorch peer numbers for bench/gemm_gpu_bench: torch._scaled_mm (FP8 e4m3 x e4m3 -> bf16,
fast accumulation, per-tensor scales) and torch.matmul (bf16) on the same shapes and layout
(A [M, K] row-major, B [N, K] row-major used transposed, i.e. TN). Run it on the GPU machine
in the same session as gemm_gpu_bench; prints a table, then one JSON object.

    python3 bench/gemm_torch.py [--iters 50] [--json FILE]
"""
import argparse
import json

import torch

SHAPES = [  # (M, N, K), as in gemm_gpu_bench.cpp
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (8192, 12288, 4096),
    (8192, 4096, 4096),
    (8192, 16384, 4096),
    (8192, 4096, 16384),
]


def time_ms(fn, iters):
    for _ in range(10):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def tflops(m, n, k, ms):
    return 2.0 * m * n * k / (ms * 1e-3) * 1e-12


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", help="also write the JSON object to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: gemm_torch.py needs a CUDA device; nothing was measured")
        return
    dev = torch.device("cuda:0")
    name = torch.cuda.get_device_name(dev)
    print(f"device: {name}, torch {torch.__version__}, {args.iters} iterations")
    print(f"{'M':>6} {'N':>6} {'K':>6} | {'_scaled_mm TFLOP/s':>18} | {'matmul bf16 TFLOP/s':>19}")
    results = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        # _scaled_mm wants B column-major: b.t() of a row-major [N, K] tensor is exactly that.
        fp8_ms = time_ms(
            lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                     out_dtype=torch.bfloat16, use_fast_accum=True),
            args.iters)
        a16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        bf16_ms = time_ms(lambda: torch.matmul(a16, b16.t()), args.iters)
        f, h = tflops(m, n, k, fp8_ms), tflops(m, n, k, bf16_ms)
        print(f"{m:>6} {n:>6} {k:>6} | {f:>18.1f} | {h:>19.1f}")
        results.append({"m": m, "n": n, "k": k, "scaled_mm_tflops": round(f, 1),
                        "matmul_bf16_tflops": round(h, 1)})
        del a, b, a16, b16
    report = json.dumps({"device": name, "torch": torch.__version__, "results": results})
    print(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
