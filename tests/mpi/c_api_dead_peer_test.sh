#!/usr/bin/env bash
# Runs c_api_dead_peer on 2 ranks (rank 1 killed) and checks that rank 0's C call returned
# QMESH_ERROR_FAILED with a message saying what timed out. --enable-recovery keeps mpirun
# from tearing rank 0 down when rank 1 dies (see kill_rank_test.sh). Never hangs: mpirun
# runs under `timeout`.
# Usage: c_api_dead_peer_test.sh <mpirun> <c_api_dead_peer> [mpirun args...]
set -u
mpirun=$1 program=$2
shift 2
out=$(timeout 120 "$mpirun" -np 2 "$@" --enable-recovery "$program" 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 124 ] || { echo "FAIL: the job hung"; exit 1; }
echo "$out" | grep -q "^failed: qmesh_world_all_reduce: .*timed out after" ||
  { echo "FAIL: rank 0 did not report the dead peer as a status and message"; exit 1; }
! echo "$out" | grep -q -e "terminate called" -e "Aborted" || { echo "FAIL: crashed"; exit 1; }
echo "PASS"
