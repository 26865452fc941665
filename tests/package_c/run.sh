#!/usr/bin/env bash
# Builds the C consumer (main.c) against an installed qmesh twice, with pkg-config and with
# find_package(qmesh), and runs each on 2 ranks under mpirun.
# Usage: tests/package_c/run.sh <install prefix> <work dir>
set -euo pipefail
# shellcheck source=tests/tools/package_consumer.sh
source "$(dirname "$0")/../tools/package_consumer.sh"
pc_dir=$(dirname "$(find "$prefix" -name qmesh.pc | head -n 1)")
[ -f "$pc_dir/qmesh.pc" ] || { echo "no qmesh.pc under $prefix"; exit 1; }

echo "pkg-config: $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs qmesh)"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror -pedantic "$src/main.c" -o "$work/pc_consumer" \
  $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs qmesh)
# As a user runs it: no LD_LIBRARY_PATH (pkg-config's flags give the binary an rpath).
env -u LD_LIBRARY_PATH timeout 120 mpirun -np 2 "${mpirun_args[@]}" "$work/pc_consumer"

cmake -S "$src" -B "$work/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake" >/dev/null
timeout 120 mpirun -np 2 "${mpirun_args[@]}" "$work/cmake/qmesh_c_consumer"
