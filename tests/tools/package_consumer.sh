# shellcheck shell=bash disable=SC2034
# Sourced by tests/package/run.sh and tests/package_c/run.sh with their arguments
# (<install prefix> <work dir>): sets prefix, work (emptied) and src (the caller's folder),
# and what their mpirun runs need (mpirun_args: the local Open MPI setup, without -np).
prefix=$(realpath "$1")
work=$2
src=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 QMESH_COMM_TIMEOUT_S=30
mpirun_args=(--oversubscribe --mca pml ob1 --mca btl self,vader)
