#!/bin/bash
# Runs mpi_kill_rank with 4 ranks, rank 2 the victim, in one mode (all_reduce: a series of
# all-reduces; ring: ring collective GEMMs; grad_sync: GradSync buckets; world: rank 2 dies
# before creating the world), and checks that every survivor exited with a non-zero status
# and a clear timeout message within 2 x QMESH_COMM_TIMEOUT_S of the kill, naming a peer
# rank: on MPI's own collectives (all_reduce, grad_sync) and in world creation (on UCX too:
# its MPI bootstrap creates an MPI world first) exactly the victim, rank 2 (the ranks' roll
# call after the timeout); in rings (UCX, collective GEMMs) the peer the rank's ring step
# waited for, which may be a survivor that itself waits for the victim. Each rank runs under a small shell wrapper that
# records its exit status and time (<dir>/exit<r>), so the check does not depend on what
# mpirun reports. Never hangs: mpirun runs under `timeout`.
#
# usage: kill_rank_test.sh <mpirun> <mpi_kill_rank> <timeout seconds> <mode> [mpirun args...]
#
# Open MPI settings: --enable-recovery (orte_enable_recovery) keeps the runtime from
# killing the job when the victim dies, so that the survivors reach their own timeout and
# report it; without it mpirun would SIGTERM them first and nothing would be learnt about
# qmesh's behaviour. With it, mpirun itself exits 0 once every process has ended, so the
# survivors' own exit statuses are what is checked. The MPI backend sets MPI_ERRORS_RETURN
# on its communicators.
set -u
mpirun=$1 program=$2 timeout_s=$3 mode=$4
shift 4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

export QMESH_COMM_TIMEOUT_S=$timeout_s
wrapper='"$0" "$1" 2 "$2"; echo "$? $(date +%s%3N)" >"$1/exit$OMPI_COMM_WORLD_RANK"'
timeout $((timeout_s * 6)) "$mpirun" -np 4 "$@" --enable-recovery \
  sh -c "$wrapper" "$program" "$dir" "$mode" >"$dir/mpirun.log" 2>&1
rc=$?
cat "$dir/mpirun.log"
fail() { echo "kill_rank_test: FAIL: $*"; exit 1; }

[ "$rc" -ne 124 ] || fail "the job hung (killed by timeout after $((timeout_s * 6)) s)"
[ -f "$dir/victim.txt" ] || fail "the victim did not record its death"
killed_ms=$(awk '{print $2}' "$dir/victim.txt")
limit_ms=$((2 * timeout_s * 1000))
for r in 0 1 3; do
  f="$dir/rank$r.txt"
  [ -f "$f" ] || fail "rank $r left no result (killed before it could report?)"
  read -r status when message <"$f"
  [ "$status" = FAILED ] || fail "rank $r: expected FAILED, got: $(cat "$f")"
  case "$message" in
    *"timed out after"*) ;;
    *) fail "rank $r: the message does not say what timed out: $message" ;;
  esac
  if { [ "${QMESH_TEST_WORLD:-mpi}" = mpi ] && [ "$mode" != ring ]; } || [ "$mode" = world ]; then
    case "$message" in
      *"peer rank 2 did not answer"*) ;;
      *) fail "rank $r: the message does not name the dead rank 2: $message" ;;
    esac
  else
    echo "$message" | grep -Eq "peer ranks? [0-9]" ||
      fail "rank $r: the message does not name the peer it waited for: $message"
  fi
  [ -f "$dir/exit$r" ] || fail "rank $r: no exit status recorded"
  read -r code exited_ms <"$dir/exit$r"
  [ "$code" -ne 0 ] || fail "rank $r exited with status 0"
  elapsed=$((exited_ms - killed_ms))
  [ "$elapsed" -le "$limit_ms" ] || fail "rank $r exited ${elapsed} ms after the kill (limit ${limit_ms} ms)"
  echo "rank $r: exit status $code, ${elapsed} ms after the kill (reported $((when - killed_ms)) ms): $message"
done
echo "kill_rank_test ($mode): PASS (mpirun exit status $rc)"
