#!/bin/bash
# Checks fault_trial.sh's pass rule on stand-in ranks (no qmesh program): rank 2 is killed
# at once, and each survivor, a second later, prints a line and leaves in one of four ways.
# A survivor that names the peer, or prints MPI's documented sentence for a job on several
# hosts (comm/timeout_text.h: unnamed_peer_text), and exits 1 passes; one whose timeout
# message names no peer, or that dies by SIGABRT (std::terminate after an uncaught
# qmesh::Error) after a correct message, fails the trial. A launcher that outlives its ranks
# (a stand-in for mpirun stuck after a PMIx error) must not hang the trial.
#
# usage: trial_rule_test.sh [mpirun]
set -u
here=$(cd "$(dirname "$0")" && pwd)
export MPIRUN=${1:-${MPIRUN:-mpirun}}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
opening="MPI all_reduce (rank 0 of 4) timed out after 5 s (QMESH_COMM_TIMEOUT_S)"
bad=0
# check <expected PASS|FAIL> <why it must fail, grep pattern> <survivor's message> <exit>
# [launcher (mpirun)]
check() {
  local expected=$1 why=$2 message=$3 leave=$4 launcher=${5:-mpirun} out
  out=$("$here/fault_trial.sh" "$work/$RANDOM" "$launcher" KILL 2 0 5 \
    sh -c 'sleep 1; echo "$1" >&2; eval "$2"' sh "$message" "$leave" 2>&1)
  if { [ "$expected" = PASS ] && echo "$out" | grep -q "fault_trial: PASS"; } ||
    { [ "$expected" = FAIL ] && echo "$out" | grep "fault_trial: FAIL" | grep -q "$why"; }; then
    echo "ok: $expected: $message ($leave)"
  else
    echo "WRONG: expected $expected ($why): $message ($leave)"; echo "$out" | tail -5
    bad=$((bad + 1))
  fi
}
check PASS "" "$opening: peer rank 2 did not answer the roll call" "exit 1"
check PASS "" "$opening: MPI cannot name the peer rank this all_reduce waits for in a job on several hosts: a rank died, froze, or never joined it" "exit 1"
check FAIL "does not name the peer" "$opening: MPI does not say which peer rank this all_reduce waits for" "exit 1"
check FAIL "died of signal 6" "$opening: peer rank 2 did not answer the roll call" 'kill -ABRT $$'
# qmeshrun's stand-in: mpirun, then a wait that only the trial's kill ends.
printf '#!/bin/sh\n"%s" --oversubscribe "$@"\nexec sleep 600\n' "$MPIRUN" >"$work/stuck_launcher"
chmod +x "$work/stuck_launcher"
QMESHRUN=$work/stuck_launcher check PASS "" "$opening: peer rank 2 did not answer the roll call" \
  "exit 1" qmeshrun
[ $bad = 0 ] && echo "trial_rule_test: PASS" || { echo "trial_rule_test: FAIL ($bad wrong)"; exit 1; }
