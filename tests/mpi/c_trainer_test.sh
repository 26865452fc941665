#!/usr/bin/env bash
# The C trainer (examples/c_trainer, C API only) against train_mlp under mpirun (4 ranks):
# with the same options both must end with bitwise the same parameters (every rank's
# checksum), for FP8 delayed, current and block scaling, NVFP4 (emulated), sequence
# parallelism (with the ring collective GEMMs and a regathered input), AdamW and SGD; a
# different seed must change them (the comparison can fail); a checkpoint written by either
# program resumes in the other to the same bits; bad input must give a message
# and a non-zero exit, not a crash.
# Usage: c_trainer_test.sh <mpiexec> <c_trainer> <train_mlp> <mpirun args...>
set -uo pipefail
mpiexec=$1
c_trainer=$2
train_mlp=$3
shift 3
mpirun_args=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
small=(--dp 2 --tp 2 --layers 2 --hidden 64 --ffn 256 --seq 32 --batch 4 --log-every 1000)
fail() { echo "FAIL: $*"; exit 1; }
run4() { timeout 120 "$mpiexec" -np 4 "${mpirun_args[@]}" "$@"; }
sums() { grep '^parameter checksums:' "$1" | head -n 1; }

compare() {
  run4 "$c_trainer" "${small[@]}" --steps 6 "$@" >"$work/c.log" 2>&1 || { cat "$work/c.log"; fail "c_trainer $*"; }
  run4 "$train_mlp" "${small[@]}" --steps 6 "$@" --device cpu >"$work/cpp.log" 2>&1 ||
    { cat "$work/cpp.log"; fail "train_mlp $*"; }
  a=$(sums "$work/c.log")
  b=$(sums "$work/cpp.log")
  echo "c_trainer $*: $a"
  echo "train_mlp $*: $b"
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "parameters differ for: $*"
}

compare --recipe delayed
compare --recipe current --sequence-parallel --optimizer sgd
compare --recipe block --sequence-parallel
compare --recipe nvfp4 --emulate
compare --recipe delayed --sequence-parallel --overlap ring --regather-input
compare --recipe delayed --margin 1 --amax-history 4
seeded=$a
compare --recipe delayed --margin 1 --amax-history 4 --seed 99
[ "$seeded" != "$a" ] || fail "a different seed gave the same parameters"

# Checkpoints in one format: 3 steps of one program, resumed for 3 more by the other, end
# where 6 uninterrupted steps of train_mlp end.
resumed() {  # resumed <first program> <second program>
  rm -rf "$work/ckpt"
  run4 "$1" "${small[@]}" --steps 3 --checkpoint-dir "$work/ckpt" >"$work/first.log" 2>&1 ||
    { cat "$work/first.log"; fail "$1 --steps 3"; }
  run4 "$2" "${small[@]}" --steps 6 --checkpoint-dir "$work/ckpt" --resume >"$work/second.log" 2>&1 ||
    { cat "$work/second.log"; fail "$2 --resume"; }
  grep -q "resumed from" "$work/second.log" || fail "$2 did not resume"
  sums "$work/second.log"
}
run4 "$train_mlp" "${small[@]}" --steps 6 >"$work/full.log" 2>&1 || fail "train_mlp 6 steps"
full=$(sums "$work/full.log")
for order in "$train_mlp $c_trainer" "$c_trainer $train_mlp" "$c_trainer $c_trainer"; do
  # shellcheck disable=SC2086
  got=$(resumed $order)
  echo "uninterrupted: $full"
  echo "resumed ($(basename ${order% *}) then $(basename ${order#* })): $got"
  [ -n "$full" ] && [ "$got" = "$full" ] || fail "resumed parameters differ"
done

# Bad input: one clear message, a non-zero exit, no crash.
run4 "$c_trainer" --tp 3 >"$work/bad.log" 2>&1 && fail "accepted --tp 3 on 4 ranks"
grep -q "tp 3 does not divide the number of ranks 4" "$work/bad.log" ||
  { cat "$work/bad.log"; fail "no message for --tp 3"; }
! grep -q -e "terminate called" -e "Aborted" -e "core dumped" "$work/bad.log" || fail "crashed"
"$c_trainer" --recipe fp9 >"$work/bad.log" 2>&1 && fail "accepted --recipe fp9"
grep -q "bad value 'fp9' for --recipe" "$work/bad.log" || fail "no message for --recipe fp9"
"$c_trainer" --help | grep -q "Usage:" || fail "no --help"
"$c_trainer" --steps 0 >"$work/bad.log" 2>&1 && fail "accepted --steps 0"  # was 'final loss 0'
grep -q "bad value '0' for --steps" "$work/bad.log" || fail "no message for --steps 0"
"$c_trainer" --layers -1 >"$work/bad.log" 2>&1 && fail "accepted --layers -1"
grep -q "bad value '-1' for --layers" "$work/bad.log" || fail "no message for --layers -1"
"$c_trainer" --steps 2 --bogus >"$work/bad.log" 2>&1 && fail "accepted --bogus"
grep -q "unknown option '--bogus'" "$work/bad.log" || fail "no message for --bogus"
"$c_trainer" --steps >"$work/bad.log" 2>&1 && fail "accepted --steps without a value"
grep -q -- "--steps needs a value" "$work/bad.log" || fail "no message for --steps alone"
run4 "$c_trainer" "${small[@]}" --steps 6 --resume --checkpoint-dir "$work/none" >"$work/bad.log" 2>&1 &&
  fail "resumed from nothing"
grep -q "no checkpoint to resume from" "$work/bad.log" || { cat "$work/bad.log"; fail "no message"; }
# A failure before the world exists names no rank (it said "rank -1").
QMESH_COMM_TIMEOUT_S=soon "$c_trainer" --steps 2 >"$work/bad.log" 2>&1 &&
  fail "accepted QMESH_COMM_TIMEOUT_S=soon"
grep -q "^c_trainer: qmesh_world_create_mpi(.*QMESH_COMM_TIMEOUT_S='soon' is not a number" \
  "$work/bad.log" || { cat "$work/bad.log"; fail "no message without a rank"; }
echo "PASS"
