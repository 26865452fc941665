#!/usr/bin/env bash
# Builds the minimal trainer (main.cpp) against an installed qmesh with its CMake package, as
# a user would, with the CUDA toolkit hidden from CMake (a CPU-only consumer must not need
# it), then trains it for 30 steps on 4 ranks (dp 2 x tp 2) and resumes it from its checkpoint
# for 30 more; each run must end below the loss of predicting the mean.
# Usage: tests/package/run.sh <install prefix> <work dir>
set -euo pipefail
# shellcheck source=tests/tools/package_consumer.sh
source "$(dirname "$0")/../tools/package_consumer.sh"
cmake -S "$src" -B "$work" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON --no-warn-unused-cli >/dev/null
cmake --build "$work" >/dev/null
run() {
  timeout 300 mpirun -np 4 "${mpirun_args[@]}" "$work/trainer" "$work/checkpoints"
}
run | tee "$work/first.log"
grep -q "step 30 loss" "$work/first.log" || { echo "FAIL: the first run did not reach step 30"; exit 1; }
run | tee "$work/resumed.log"
grep -q "step 60 loss" "$work/resumed.log" || { echo "FAIL: the resumed run did not reach step 60"; exit 1; }
grep -q "step 10 loss" "$work/resumed.log" && { echo "FAIL: the second run did not resume"; exit 1; }
echo "PASS: tests/package (trained, checkpointed, resumed)"
