#!/usr/bin/env bash
# The main job: installs what is missing, builds qmesh in build/, then trains train_mlp
# under mpirun with 4 ranks (dp 2 x tp 2), first with FP8 delayed scaling, then with BF16
# GEMMs, and plots both loss curves. Runs on the CPU backend (no GPU needed).
# Usage: launch/demo.sh [extra train_mlp options, e.g. --steps 300]
set -euo pipefail
cd "$(dirname "$0")/.."

launch/install_deps.sh
mkdir -p build
echo "=== configure and build (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >build/configure.log 2>&1 ||
  { cat build/configure.log; exit 1; }
cmake --build build -j "$(nproc)" --target train_mlp

out=build/demo
mkdir -p "$out"
common=(--dp 2 --tp 2 --layers 2 --hidden 256 --ffn 1024 --seq 64 --batch 8 --steps 100
        --log-every 20 "$@")
echo
echo "=== FP8 (delayed scaling), dp 2 x tp 2"
launch/qmeshrun -np 4 build/examples/train_mlp/train_mlp "${common[@]}" --recipe delayed \
  --csv "$out/fp8_delayed.csv" | tee "$out/fp8_delayed.log"
echo
echo "=== BF16, same configuration"
launch/qmeshrun -np 4 build/examples/train_mlp/train_mlp "${common[@]}" --recipe bf16 \
  --csv "$out/bf16.csv" --plot "$out/loss.png" --compare "$out/fp8_delayed.csv" |
  tee "$out/bf16.log"

echo
echo "=== summary"
fp8=$(grep '^final loss' "$out/fp8_delayed.log" | awk '{print $3}')
bf16=$(grep '^final loss' "$out/bf16.log" | awk '{print $3}')
base=$(grep '^loss of predicting the mean' "$out/bf16.log" | awk '{print $NF}')
echo "final loss, FP8 delayed scaling: $fp8"
echo "final loss, BF16:                $bf16"
echo "loss of predicting the mean:     $base"
echo "loss curves: $out/loss.png"
