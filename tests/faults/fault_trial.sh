#!/bin/bash
# One fault-injection trial: runs a 4-rank job, sends SIGKILL or SIGSTOP to one rank after a
# delay, and checks that every other rank ends, with a non-zero status, within
# 2 x QMESH_COMM_TIMEOUT_S of the signal. Under `mpirun --enable-recovery` (launcher
# mpirun) the runtime leaves the survivors alone, so each must also leave by itself with a
# message saying what timed out or failed ("timed out after", "did not return within",
# "MPI call failed", "UCX call failed", a transfer that "failed in UCX" (a TCP connection
# that the dead peer's end reset), or Open MPI's own report of a failed MPI_Init: "MPI_INIT
# has failed" through mpirun, "An error occurred in MPI_Init_thread" from the rank); each timeout
# message must also name the peer rank(s) waited for ("peer rank 2 ...",
# comm/timeout_text.h), not only the operation, or be MPI's one sentence for a job on
# several hosts, where it cannot ("MPI cannot name the peer rank this <op> waits for in a
# job on several hosts: a rank died, froze, or never joined it"). A survivor must leave
# through its own error handling: under mpirun, a survivor ended by a signal fails the
# trial (the runtime signals none), and under either launcher one that crashed or aborted
# (SIGABRT, e.g. std::terminate after an uncaught qmesh::Error; SIGSEGV, SIGBUS, SIGFPE,
# SIGILL). Under qmeshrun the runtime
# may end the job itself when a rank dies (it kills the survivors), so ending within the
# limit is what is checked. On a hang the
# survivors' stacks (gdb) are saved to <artifacts>/stacks.rank<r>.txt and the trial fails.
# Never hangs itself: every process it started is killed at the end.
#
# usage: fault_trial.sh <artifacts dir> <mpirun|qmeshrun> <KILL|STOP> <victim rank>
#                       <delay ms> <timeout s> program [args...]
# Environment: MPIRUN (default mpirun), QMESHRUN (default launch/qmeshrun of this tree).
set -u
art=$1 launcher=$2 sig=$3 victim=$4 delay_ms=$5 timeout_s=$6
shift 6
np=4
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$art"
export QMESH_COMM_TIMEOUT_S=$timeout_s OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "fault_trial: FAIL: $*"; for f in "$art"/err.*; do [ -f "$f" ] && { echo "--- $f"; tail -5 "$f"; }; done; exit 1; }
now_ms() { date +%s%3N; }

# Each rank: the program in the background (its pid recorded), its status and exit time
# written when it ends; a SIGTERM from the runtime is passed on to it.
wrapper='d=$1; shift; r=$OMPI_COMM_WORLD_RANK
"$@" >"$d/out.$r" 2>"$d/err.$r" & p=$!
echo $p >"$d/pid.$r"; trap "kill -TERM $p 2>/dev/null" TERM
wait $p; s=$?; while kill -0 $p 2>/dev/null; do wait $p; s=$?; done
echo "$s $(date +%s%3N)" >"$d/exit.$r"; exit $s'
case $launcher in
  mpirun) launch=("${MPIRUN:-mpirun}" -np $np --oversubscribe --mca pml ob1 --mca btl self,vader
                  --enable-recovery) ;;
  qmeshrun) launch=("${QMESHRUN:-$here/../../launch/qmeshrun}" -np $np) ;;
  *) echo "fault_trial: launcher must be mpirun or qmeshrun" >&2; exit 2 ;;
esac
limit_ms=$((2 * timeout_s * 1000))
"${launch[@]}" sh -c "$wrapper" sh "$art" "$@" >"$art/launcher.log" 2>&1 &
launcher_pid=$!
cleanup() {
  for f in "$art"/pid.*; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
  kill -KILL $launcher_pid 2>/dev/null; wait $launcher_pid 2>/dev/null
}
trap cleanup EXIT

# Wait for every rank's pid, then for the chosen moment.
for ((i = 0; i < 600; i++)); do
  n=$(ls "$art"/pid.* 2>/dev/null | wc -l)
  [ "$n" -eq $np ] && break
  kill -0 $launcher_pid 2>/dev/null || fail "the job ended before every rank started"
  sleep 0.1
done
[ "$n" -eq $np ] || fail "not every rank started within 60 s"
sleep "$(awk -v ms="$delay_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
vpid=$(cat "$art/pid.$victim")
for r in $(seq 0 $((np - 1))); do
  [ $r = $victim ] || kill -0 "$(cat "$art/pid.$r")" 2>/dev/null ||
    fail "rank $r ended before the fault (delay too long for this program?)"
done
kill -"$sig" "$vpid" || fail "cannot signal rank $victim (pid $vpid)"
signalled=$(now_ms)
echo "fault_trial: SIG$sig to rank $victim (pid $vpid) after ${delay_ms} ms"

# Wait for the survivors, up to the limit plus a little slack for process teardown.
hung=()
for r in $(seq 0 $((np - 1))); do
  [ $r = $victim ] && continue
  pid=$(cat "$art/pid.$r")
  while kill -0 "$pid" 2>/dev/null && [ $(($(now_ms) - signalled)) -le $((limit_ms + 2000)) ]; do
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && hung+=("$r")
done
if [ ${#hung[@]} -gt 0 ]; then
  for r in "${hung[@]}"; do
    gdb -p "$(cat "$art/pid.$r")" -batch -ex "thread apply all bt" >"$art/stacks.rank$r.txt" 2>&1
  done
  fail "rank(s) ${hung[*]} still running $((limit_ms / 1000 + 2)) s after the fault; stacks in $art"
fi
[ "$sig" = STOP ] && kill -KILL "$vpid" 2>/dev/null
# The launcher ends with its ranks, except when its runtime is stuck (seen: mpirun after
# "PMIX ERROR: UNREACHABLE", a rank killed inside MPI_Init): the ranks' own results are
# what is checked, so it gets 10 s.
for ((i = 0; i < 100; i++)); do kill -0 $launcher_pid 2>/dev/null || break; sleep 0.1; done
kill -0 $launcher_pid 2>/dev/null && echo "fault_trial: the launcher did not end with its ranks; killed"
kill -KILL $launcher_pid 2>/dev/null; wait $launcher_pid 2>/dev/null

for r in $(seq 0 $((np - 1))); do
  [ $r = $victim ] && continue
  if [ ! -f "$art/exit.$r" ]; then
    [ "$launcher" = qmeshrun ] && { echo "rank $r: ended by the runtime"; continue; }
    fail "rank $r: no exit status recorded (killed by the runtime?)"
  fi
  read -r code exited <"$art/exit.$r"
  if [ -z "${exited:-}" ] && [ "$launcher" = qmeshrun ]; then  # its wrapper was killed too
    echo "rank $r: ended by the runtime"; continue
  fi
  [ "$code" -ne 0 ] || fail "rank $r exited with status 0 after the fault"
  if [ "$code" -gt 128 ] && [ "$code" -le 192 ]; then
    case $((code - 128)) in
      4 | 6 | 7 | 8 | 11) fail "rank $r died of signal $((code - 128)) (status $code): a crash or abort (std::terminate after an uncaught exception?), not an error exit" ;;
    esac
    [ "$launcher" = mpirun ] &&
      fail "rank $r died of signal $((code - 128)) (status $code) under plain mpirun, whose runtime signals no survivor"
  fi
  elapsed=$((exited - signalled))
  [ $elapsed -le $limit_ms ] || fail "rank $r exited ${elapsed} ms after the fault (limit ${limit_ms} ms)"
  if [ "$code" -le 128 ] || [ "$launcher" = mpirun ]; then
    # Open MPI reports a failed MPI_Init itself, through mpirun or the rank.
    grep -q "timed out after\|did not return within\|MPI call failed\|UCX call failed\|failed in UCX\|An error occurred in MPI_Init_thread" \
      "$art/err.$r" ||
      grep -q "MPI_INIT has failed" "$art/launcher.log" ||
      fail "rank $r (status $code): no message saying what timed out or failed"
    if grep "timed out after" "$art/err.$r" | grep -Ev "peer ranks? [0-9]" |
      grep -Evq "MPI cannot name the peer rank this [A-Za-z_ ]+ waits for in a job on several hosts: a rank died, froze, or never joined it"; then
      fail "rank $r (status $code): a timeout message does not name the peer it waited for"
    fi
  fi
  echo "rank $r: status $code, ${elapsed} ms after the fault: $(grep -m1 "timed out after\|did not return\|failed" "$art/err.$r" | cut -c1-400)"
done
echo "fault_trial: PASS"
