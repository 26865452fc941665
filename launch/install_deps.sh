#!/usr/bin/env bash
# Installs the Debian packages qmesh builds, tests and runs with, skipping what is already
# there (idempotent). The CUDA toolkit is not a Debian package: when nvcc is absent qmesh
# configures without CUDA. Usage: launch/install_deps.sh
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libopenmpi-dev openmpi-bin        # MPI backend, mpirun
  libucx-dev ucx-utils              # UCX backend
  libopenblas-dev                   # CPU GEMMs
  libboost-program-options-dev      # example CLIs
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  zlib1g-dev                        # checkpoint checksums
  clang-format                      # format check
  gnuplot-nox                       # loss-curve plots
  clang libclang-rt-14-dev          # libFuzzer targets (tests/fuzz)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
