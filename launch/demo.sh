#!/usr/bin/env bash
# The main job: installs what is missing, builds qmesh in build/, and runs the end-to-end
# example. Usage: launch/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

launch/install_deps.sh
mkdir -p build
echo "=== configure and build (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >build/configure.log 2>&1 ||
  { cat build/configure.log; exit 1; }
cmake --build build -j "$(nproc)" --target fp8_roundtrip

echo
echo "=== fp8_roundtrip: FP8 quantization round trip of a random tensor with outliers"
echo "    (the mpirun training example replaces this once it exists)"
build/examples/fp8_roundtrip --elements 4194304
