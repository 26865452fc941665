#!/bin/bash
# Fault-injection campaign: many fault_trial.sh trials, each killing (SIGKILL) or freezing
# (SIGSTOP) one random rank of a 4-rank job at a random moment (by default 0-3 s after start:
# MPI start-up, world creation, mesh construction, training steps, collective-GEMM rings,
# bucketed gradient syncs, checkpoint writes), over the MPI and UCX backends, under plain
# `mpirun --enable-recovery` and launch/qmeshrun. A train_mlp job that writes a checkpoint
# every step must leave a newest complete checkpoint that still loads (a resume from it
# runs). Prints one line per trial and a summary; exits non-zero if any trial failed
# (artifacts, with gdb stacks of hung ranks, stay in the work directory).
#
# usage: campaign.sh [--delay-ms <from>-<to>] <build dir> [trials (default 20)]
#                    [seed (default: random)] [timeout s (default 5)]
#   --delay-ms <from>-<to>  the fault's moment, drawn in [from, to) ms after every rank has
#                           started (default 0-3000); e.g. 0-200 aims at MPI start-up, world
#                           creation and mesh construction. The same seed and range replay
#                           the same trials.
# The local (threads) backend's ranks share one process, so a signal cannot stop one alone:
# its trials (local_*) run local_fault, whose victim thread freezes or dies by itself at its
# first communicator call after the delay (KILL: dies, STOP: freezes; no launcher). UCX runs
# over qmesh's default transports (UCX's without cma, docs/reliability.md).
set -u
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
delay_from=0 delay_to=3000
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --delay-ms) [[ ${2:-} =~ ^([0-9]+)-([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -lt "${BASH_REMATCH[2]}" ] ||
        { echo "campaign: --delay-ms needs <from>-<to> in ms, from < to (e.g. 0-200)" >&2; exit 2; }
      delay_from=${BASH_REMATCH[1]} delay_to=${BASH_REMATCH[2]}; shift 2 ;;
    -*) echo "campaign: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { usage >&2; exit 2; }
build=$1 trials=${2:-20} seed=${3:-$RANDOM} timeout_s=${4:-5}
here=$(cd "$(dirname "$0")" && pwd)
RANDOM=$seed coin=$seed
work=$(mktemp -d /tmp/qmesh-faults.XXXXXX)
train="$build/examples/train_mlp/train_mlp --dp 2 --tp 2 --hidden 64 --ffn 128 --seq 16
       --batch 4 --log-every 1000000"
kill_rank="$build/tests/mpi/mpi_kill_rank"
programs=(train train_ring train_ckpt mpi_all_reduce mpi_ring mpi_grad_sync)
[ -x "$kill_rank" ] && grep -q "QMESH_WITH_UCX:BOOL=ON" "$build/CMakeCache.txt" &&
  programs+=(ucx_all_reduce ucx_ring ucx_grad_sync)
[ -x "$build/tests/faults/local_fault" ] && programs+=(local_train local_ckpt)
echo "campaign: $trials trials, seed $seed, faults at ${delay_from}-${delay_to} ms," \
  "QMESH_COMM_TIMEOUT_S=$timeout_s, work dir $work"
passed=0
for ((t = 1; t <= trials; t++)); do
  program=${programs[RANDOM % ${#programs[@]}]}
  # Launcher and signal come from a generator of their own (an LCG on `coin`): drawn from
  # RANDOM inside $(...) subshells, which bash reseeds, they did not replay with the seed,
  # and drawing them from RANDOM here would change the program, victim and moment of earlier
  # seeds.
  coin=$(((coin * 1103515245 + 12345) % 2147483648))
  launcher=mpirun sig=KILL
  (((coin >> 16) & 1)) && launcher=qmeshrun
  (((coin >> 17) & 1)) && sig=STOP
  victim=$((RANDOM % 4)) delay=$((delay_from + RANDOM % (delay_to - delay_from)))
  art=$work/trial$t
  mkdir -p "$art"
  env=()
  case $program in
    train) cmd=($train --steps 1000000) ;;
    train_ring) cmd=($train --steps 1000000 --sequence-parallel --overlap ring) ;;
    train_ckpt) cmd=($train --steps 1000000 --checkpoint-dir "$art/ckpt" --checkpoint-every 1) ;;
    mpi_*) cmd=("$kill_rank" "$art" -1 "${program#mpi_}" 1000000) env=(QMESH_TEST_WORLD=mpi) ;;
    ucx_*) cmd=("$kill_rank" "$art" -1 "${program#ucx_}" 1000000)
           env=(QMESH_TEST_WORLD=ucx) ;;
  esac
  what="trial $t: $program, $launcher, SIG$sig rank $victim at ${delay} ms"
  failure=""  # empty: the trial passed
  if [[ $program == local_* ]]; then
    how=$([ $sig = KILL ] && echo die || echo freeze)
    what="trial $t: $program, rank $victim should ${how} at ${delay} ms"
    workload=$([ $program = local_ckpt ] && echo checkpoint || echo train)
    rc=0
    timeout $((6 * timeout_s + 30)) "$build/tests/faults/local_fault" "$workload" "$victim" \
      "$delay" "$how" "$timeout_s" "$art/ckpt" >"$art/trial.log" 2>&1 || rc=$?
    [ $rc = 0 ] || failure="exit status $rc; $(grep -m1 FAIL "$art/trial.log")"
  elif ! env "${env[@]}" "$here/fault_trial.sh" "$art" "$launcher" "$sig" "$victim" "$delay" \
      "$timeout_s" "${cmd[@]}" >"$art/trial.log" 2>&1; then
    failure=$(grep -m1 FAIL "$art/trial.log")
  elif [ "$program" = train_ckpt ] && [ -f "$art/ckpt/latest" ]; then
    # The newest complete checkpoint loads: resume from it (no further steps to run).
    QMESH_COMM_TIMEOUT_S=$timeout_s OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      timeout 120 "$here/../../launch/qmeshrun" -np 4 $train --checkpoint-dir "$art/ckpt" \
      --resume --steps 1 >"$art/resume.log" 2>&1
    grep -q "resumed from" "$art/resume.log" ||
      failure="the newest checkpoint did not load (see $art/resume.log)"
  fi
  if [ -z "$failure" ]; then
    passed=$((passed + 1))
    echo "$what: PASS"
    # Where the fault landed: the first survivor's line (its status, time and message).
    grep -m1 "^rank [0-9]*: \(ok\|status\)" "$art/trial.log" | cut -c1-300 | sed 's/^/  /'
    rm -rf "$art"
  else
    echo "$what: FAIL ($failure)"
  fi
done
echo "campaign: $passed of $trials trials passed (seed $seed)"
[ $passed = "$trials" ] || { echo "campaign: artifacts of failed trials in $work"; exit 1; }
rm -rf "$work"
