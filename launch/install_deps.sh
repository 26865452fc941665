#!/usr/bin/env bash
# Installs the Debian packages qmesh builds, tests and runs with, skipping what is already
# there (idempotent). The CUDA toolkit is not a Debian package: when nvcc is absent qmesh
# configures without CUDA. Usage: launch/install_deps.sh [--multinode]
#   --multinode  also what the multi-node cluster, tests and Slurm launch need (docs/multinode.md)
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
  python3 python3-venv              # the JAX package's venvs (launch/python_env.sh)
  clang libclang-rt-14-dev          # libFuzzer targets (tests/fuzz)
)
if [ "${1:-}" = "--multinode" ]; then
  packages+=(iproute2 util-linux    # network-namespace nodes (launch/cluster/nscluster)
             slurmctld slurmd slurm-client munge  # a real Slurm in tests/multinode
             python3-matplotlib)                  # scaling charts (bench/scaling)
fi

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
