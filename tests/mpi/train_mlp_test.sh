#!/usr/bin/env bash
# End-to-end checks of the train_mlp example under mpirun (4 ranks, dp 2 x tp 2).
# Usage: train_mlp_test.sh <qmeshrun> <train_mlp> <case>
#   converge   FP8 delayed scaling learns, and ends within 5% of the BF16 run's loss; FP8
#              block scaling (also with --sequence-parallel) ends no worse than delayed
#              scaling (0.5% slack for rounding noise); MXFP8 and NVFP4 are refused without
#              --emulate and train with it
#   resume     20 steps == 10 steps, checkpoint, resume, 10 more (bit for bit); also under
#              block scaling and NVFP4 (emulated)
#   overlap    --overlap ring and bidir, and --regather-input, train to the same bits as
#              --overlap none (SP; FP8 delayed and block scaling)
#   fsdp       --dp 4, --fsdp 4 and --dp 2 --fsdp 2 (and dp 2 vs fsdp 2 with tp 2) train to the
#              same bits with --rank-order (FP8 delayed and BF16, sizes fsdp does not divide;
#              FP8 block scaling at tp 1);
#              an fsdp run resumes bit for bit, also resharded at load (dp 2 x fsdp 2 to
#              fsdp 4, and between fsdp and no fsdp both ways, FP8 delayed and BF16, tp 1
#              and 2); resuming with another tp is a clear error naming both layouts
#   bad-input  bad options and checkpoints give one clear message and a non-zero exit
set -uo pipefail
run=$1
train=$2
case_name=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
small=(--dp 2 --tp 2 --layers 1 --hidden 64 --ffn 256 --seq 32 --batch 4 --log-every 1000)
fail() { echo "FAIL: $*"; exit 1; }

train4() { timeout 300 "$run" -np 4 "$train" "$@"; }

field() { grep "^$1" "$2" | head -n 1; }

# A microscaled recipe ($1: mxfp8 or nvfp4): refused without --emulate by an error that says
# how to ask, then 80 emulated steps; prints the final loss (or, failing, the logs and why).
emulated_run() {
  train4 "${small[@]}" --steps 80 --recipe "$1" >"$work/$1-refused.log" 2>&1 &&
    fail "$1 without --emulate ran (its GEMMs must be refused without emulation)"
  grep -q "QMESH_BLOCK_EMULATION=1" "$work/$1-refused.log" ||
    { cat "$work/$1-refused.log"; fail "$1 without --emulate: no error saying how to ask"; }
  train4 "${small[@]}" --steps 80 --recipe "$1" --emulate >"$work/$1.log" 2>&1 ||
    { cat "$work/$1.log"; fail "$1 run (emulated GEMMs)"; }
  field "final loss" "$work/$1.log" | awk '{print $3}'
}

# 8 steps == 4 steps, a checkpoint, and 4 more after resuming, bit for bit, with the options
# after the name ($1, for messages and files).
resumes_bitwise() {
  local name=$1
  shift
  train4 "${small[@]}" "$@" --steps 8 >"$work/$name-full.log" 2>&1 || fail "$name run"
  train4 "${small[@]}" "$@" --steps 4 --checkpoint-dir "$work/$name" >/dev/null 2>&1 ||
    fail "4 $name steps"
  train4 "${small[@]}" "$@" --steps 8 --checkpoint-dir "$work/$name" --resume \
    >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name resume"; }
  a=$(field "parameter checksums" "$work/$name-full.log")
  b=$(field "parameter checksums" "$work/$name.log")
  echo "$name uninterrupted: $a"
  echo "$name resumed:       $b"
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$name: parameters differ after resuming"
}

case $case_name in
converge)
  train4 "${small[@]}" --steps 80 --recipe delayed >"$work/fp8.log" 2>&1 || fail "FP8 run"
  train4 "${small[@]}" --steps 80 --recipe bf16 >"$work/bf16.log" 2>&1 || fail "BF16 run"
  fp8=$(field "final loss" "$work/fp8.log" | awk '{print $3}')
  bf16=$(field "final loss" "$work/bf16.log" | awk '{print $3}')
  base=$(field "loss of predicting the mean" "$work/fp8.log" | awk '{print $NF}')
  echo "final loss: fp8 $fp8, bf16 $bf16, predicting the mean $base"
  awk -v a="$fp8" -v b="$bf16" 'BEGIN { exit !(a <= 1.05 * b && a >= 0.95 * b) }' ||
    fail "FP8 final loss $fp8 is not within 5% of BF16's $bf16"
  awk -v a="$fp8" -v m="$base" 'BEGIN { exit !(a < 0.5 * m) }' ||
    fail "FP8 did not learn: loss $fp8 vs $base for predicting the mean"
  train4 "${small[@]}" --steps 80 --recipe block >"$work/block.log" 2>&1 ||
    { cat "$work/block.log"; fail "FP8 block-scaling run"; }
  block=$(field "final loss" "$work/block.log" | awk '{print $3}')
  echo "final loss: fp8 block $block"
  awk -v a="$block" -v b="$fp8" 'BEGIN { exit !(a <= 1.005 * b) }' ||
    fail "FP8 block scaling's final loss $block is worse than delayed scaling's $fp8"
  train4 "${small[@]}" --steps 80 --recipe block --sequence-parallel >"$work/block-sp.log" 2>&1 ||
    { cat "$work/block-sp.log"; fail "FP8 block-scaling run with --sequence-parallel"; }
  block_sp=$(field "final loss" "$work/block-sp.log" | awk '{print $3}')
  echo "final loss: fp8 block, sequence parallel $block_sp"
  awk -v a="$block_sp" -v b="$fp8" 'BEGIN { exit !(a <= 1.005 * b) }' ||
    fail "FP8 block scaling with --sequence-parallel ends at $block_sp, worse than delayed's $fp8"
  mxfp8=$(emulated_run mxfp8) || { echo "$mxfp8"; exit 1; }
  echo "final loss: mxfp8 (emulated) $mxfp8"
  awk -v a="$mxfp8" -v b="$fp8" 'BEGIN { exit !(a <= 1.005 * b) }' ||
    fail "MXFP8's final loss $mxfp8 is worse than delayed scaling's $fp8"
  nvfp4=$(emulated_run nvfp4) || { echo "$nvfp4"; exit 1; }
  echo "final loss: nvfp4 (emulated) $nvfp4"
  awk -v a="$nvfp4" -v m="$base" 'BEGIN { exit !(a < 0.5 * m) }' ||
    fail "NVFP4 did not learn: loss $nvfp4 vs $base for predicting the mean"
  ;;
resume)
  train4 "${small[@]}" --steps 20 --csv "$work/full.csv" >"$work/full.log" 2>&1 ||
    fail "20-step run"
  train4 "${small[@]}" --steps 10 --checkpoint-dir "$work/ckpt" --csv "$work/split.csv" \
    >"$work/first.log" 2>&1 || fail "first 10 steps"
  train4 "${small[@]}" --steps 20 --checkpoint-dir "$work/ckpt" --resume \
    --csv "$work/split.csv" >"$work/second.log" 2>&1 || { cat "$work/second.log"; fail "resume"; }
  grep -q "resumed from" "$work/second.log" || fail "the second run did not resume"
  # One file per rank: the FP8 scaling state is in it, next to the parameters.
  [ "$(ls "$work/ckpt/step-10")" = "$(printf '%s\n' layout.tensors rank-{0,1,2,3}.tensors)" ] ||
    fail "unexpected files in a checkpoint: $(ls "$work/ckpt/step-10")"
  diff "$work/full.csv" "$work/split.csv" || fail "loss curves differ after resuming"
  a=$(field "parameter checksums" "$work/full.log")
  b=$(field "parameter checksums" "$work/second.log")
  echo "uninterrupted: $a"
  echo "resumed:       $b"
  [ "$a" = "$b" ] || fail "parameters differ after resuming"
  # Block scaling keeps no scaling state: its checkpoint resumes bit for bit too.
  resumes_bitwise block --recipe block
  # NVFP4 seeds stochastic rounding from the step count, which its checkpoint keeps.
  resumes_bitwise nvfp4 --recipe nvfp4 --emulate
  ;;
overlap)
  for recipe in delayed block; do
    for o in none ring bidir; do
      train4 "${small[@]}" --steps 10 --recipe $recipe --sequence-parallel --overlap $o \
        --csv "$work/$o.csv" >"$work/$o.log" 2>&1 ||
        { cat "$work/$o.log"; fail "--recipe $recipe --overlap $o"; }
    done
    # fc1's input gathered again in backward (bulk overlap with dgrad) instead of kept.
    train4 "${small[@]}" --steps 10 --recipe $recipe --sequence-parallel --overlap ring \
      --regather-input --csv "$work/regather.csv" >"$work/regather.log" 2>&1 ||
      { cat "$work/regather.log"; fail "--recipe $recipe --regather-input"; }
    for o in ring bidir regather; do
      diff "$work/none.csv" "$work/$o.csv" ||
        fail "$recipe: loss curves of --overlap $o and none differ"
      a=$(field "parameter checksums" "$work/none.log")
      b=$(field "parameter checksums" "$work/$o.log")
      echo "$recipe none:  $a"
      echo "$recipe $o: $b"
      [ -n "$a" ] && [ "$a" = "$b" ] || fail "$recipe: parameters of --overlap $o and none differ"
    done
  done
  ;;
fsdp)
  odd=(--layers 2 --hidden 60 --ffn 250 --seq 16 --batch 2 --log-every 1000 --device cpu
    --rank-order)
  for recipe in delayed bf16; do
    for layout in "--dp 4" "--fsdp 4" "--dp 2 --fsdp 2" "--dp 2 --tp 2" "--fsdp 2 --tp 2"; do
      name="$recipe${layout// /}"
      # shellcheck disable=SC2086
      train4 "${odd[@]}" --steps 8 --recipe $recipe $layout >"$work/$name.log" 2>&1 ||
        { cat "$work/$name.log"; fail "$recipe $layout"; }
      echo "$recipe $layout: $(field "parameter checksums" "$work/$name.log")"
    done
    for pair in "--dp4 --fsdp4" "--dp4 --dp2--fsdp2" "--dp2--tp2 --fsdp2--tp2"; do
      # shellcheck disable=SC2086
      set -- $pair
      a=$(field "parameter checksums" "$work/$recipe$1.log")
      b=$(field "parameter checksums" "$work/$recipe$2.log")
      [ -n "$a" ] && [ "$a" = "$b" ] || fail "$recipe: $1 and $2 trained to different parameters"
    done
  done
  # Block scaling (tp 1: --ffn 250 is not whole 128-wide blocks per tp shard): the fsdp
  # layouts gather fp32 weight shards and block-cast the gathered weight, the same bits.
  for layout in "--dp 4" "--fsdp 4" "--dp 2 --fsdp 2"; do
    name="block${layout// /}"
    # shellcheck disable=SC2086
    train4 "${odd[@]}" --steps 8 --recipe block $layout >"$work/$name.log" 2>&1 ||
      { cat "$work/$name.log"; fail "block $layout"; }
    echo "block $layout: $(field "parameter checksums" "$work/$name.log")"
  done
  for other in --fsdp4 --dp2--fsdp2; do
    a=$(field "parameter checksums" "$work/block--dp4.log")
    b=$(field "parameter checksums" "$work/block$other.log")
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "block: --dp4 and $other trained to different parameters"
  done
  train4 "${odd[@]}" --fsdp 2 --steps 12 >"$work/full.log" 2>&1 || fail "12 fsdp steps"
  train4 "${odd[@]}" --fsdp 2 --steps 6 --checkpoint-dir "$work/f" >/dev/null 2>&1 ||
    fail "6 fsdp steps"
  train4 "${odd[@]}" --fsdp 2 --steps 12 --checkpoint-dir "$work/f" --resume \
    >"$work/second.log" 2>&1 || { cat "$work/second.log"; fail "fsdp resume"; }
  [ "$(field "parameter checksums" "$work/full.log")" = \
    "$(field "parameter checksums" "$work/second.log")" ] || fail "fsdp resume differs"
  # Resharded at load: saved at step 6 with one layout, resumed with another, the run ends on
  # the bits of an uninterrupted run with the second one (the same data-parallel size, rank
  # order). reshard <name> <recipe> <saved layout> <resumed layout>
  reshard() {
    local name=$1 recipe=$2 from=$3 to=$4
    # shellcheck disable=SC2086
    train4 "${odd[@]}" --recipe "$recipe" $to --steps 12 >"$work/$name-full.log" 2>&1 ||
      fail "12 steps $recipe $to"
    # shellcheck disable=SC2086
    train4 "${odd[@]}" --recipe "$recipe" $from --steps 6 --checkpoint-dir "$work/$name" \
      >/dev/null 2>&1 || fail "6 steps $recipe $from"
    # shellcheck disable=SC2086
    train4 "${odd[@]}" --recipe "$recipe" $to --steps 12 --checkpoint-dir "$work/$name" --resume \
      >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$recipe $from resumed with $to"; }
    grep -q "resumed from" "$work/$name.log" || fail "$recipe $to did not resume"
    a=$(field "parameter checksums" "$work/$name-full.log")
    b=$(field "parameter checksums" "$work/$name.log")
    echo "$recipe $to uninterrupted: $a"
    echo "$recipe $from, resumed with $to: $b"
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "$recipe: $from resumed with $to differs"
  }
  reshard ff delayed "--dp 2 --fsdp 2" "--fsdp 4"
  for recipe in delayed bf16; do
    reshard "$recipe-fd" $recipe "--dp 2 --fsdp 2" "--dp 4"  # fsdp shards assembled whole
    reshard "$recipe-df" $recipe "--dp 4" "--fsdp 4"          # whole tensors cut into shards
  done
  reshard tp-fd delayed "--fsdp 2 --tp 2" "--dp 2 --tp 2"
  reshard tp-df bf16 "--dp 2 --tp 2" "--fsdp 2 --tp 2"
  # The last checkpoint in tp-df: dp 1 x fsdp 2 x tp 2.
  train4 "${odd[@]}" --recipe bf16 --dp 2 --fsdp 2 --steps 14 --checkpoint-dir "$work/tp-df" \
    --resume >"$work/other.log" 2>&1 && fail "resumed a tp 2 checkpoint with tp 1"
  grep -q "written with dp 1 x fsdp 2 x tp 2; resume it with tp 2 .*this run's dp 2 x fsdp 2 x tp 1" \
    "$work/other.log" || { cat "$work/other.log"; fail "no clear error for resuming with another tp"; }
  ! grep -q -e "terminate called" -e "Aborted" -e "core dumped" "$work/other.log" ||
    fail "crashed instead of reporting another tp"
  ;;
bad-input)
  # expect <message> <train_mlp args...>: non-zero exit, the message, no stack trace.
  expect() {
    local msg=$1
    shift
    train4 "$@" >"$work/out.log" 2>&1 && fail "accepted: $*"
    grep -q -- "$msg" "$work/out.log" || { cat "$work/out.log"; fail "no '$msg' for: $*"; }
    ! grep -q -e "terminate called" -e "Aborted" -e "core dumped" "$work/out.log" ||
      fail "crashed instead of reporting: $*"
    echo "ok: $* -> $msg"
  }
  expect "does not divide the number of ranks 4" --tp 3
  # The Slurm batch script run outside a Slurm job says how to submit it.
  env -u SLURM_JOB_ID bash "$(dirname "$run")/slurm/train_mlp.sbatch" >"$work/out.log" 2>&1 &&
    fail "train_mlp.sbatch ran outside a Slurm job"
  grep -q "submit it with sbatch" "$work/out.log" || { cat "$work/out.log"; fail "sbatch hint"; }
  # qmeshrun: a malformed count is mpirun's one clear message (no shell error before it); a
  # program's own -n does not change the ranks' binding (4 ranks on fewer cores still run).
  "$run" -np four "$train" >"$work/out.log" 2>&1 && fail "qmeshrun accepted -np four"
  grep -q "Param: *four" "$work/out.log" && ! grep -q "expression expected" "$work/out.log" ||
    { cat "$work/out.log"; fail "qmeshrun -np four: not one clear message"; }
  train4 "${small[@]}" --steps 1 -n 1 >"$work/out.log" 2>&1
  ! grep -q "not enough slots" "$work/out.log" ||
    { cat "$work/out.log"; fail "qmeshrun read the program's -n 1 as the rank count"; }
  expect "must be a positive multiple of --tp 4" --tp 4 --hidden 66
  expect "--fsdp 3 x --tp 1 does not divide the number of ranks 4" --fsdp 3
  expect "unknown recipe 'fp9'" --recipe fp9
  expect "add --sequence-parallel or use --overlap none" "${small[@]}" --overlap ring
  expect "expected one of: none, ring, bidir" "${small[@]}" --overlap both
  expect "add --sequence-parallel" "${small[@]}" --regather-input
  expect "unrecognised option '--bogus'" --bogus
  expect "--device must be auto, cpu or cuda" "${small[@]}" --device gpu
  expect "--recipe nvfp4: the CPU backend has no native GEMM of that format; add --emulate" \
    "${small[@]}" --device cpu --recipe nvfp4
  expect "--recipe mxfp8 runs without --sequence-parallel" "${small[@]}" --recipe mxfp8 \
    --emulate --sequence-parallel
  expect "use it with --recipe delayed or current, not nvfp4" "${small[@]}" --recipe nvfp4 \
    --emulate --fp8-stats
  if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" = 0 ]; then
    expect "this process sees no CUDA device" "${small[@]}" --device cuda
  fi
  expect "no checkpoint to resume from" "${small[@]}" --resume --checkpoint-dir "$work/none"
  train4 "${small[@]}" --steps 2 --checkpoint-dir "$work/c" >/dev/null 2>&1 || fail "save"
  expect "another tp/layers" --dp 2 --tp 2 --layers 1 --hidden 64 --ffn 256 --seq 32 \
    --batch 4 --steps 4 --sequence-parallel --resume --checkpoint-dir "$work/c"
  expect "saved under the 'delayed' recipe, but this LayerContext's recipe is 'bf16'" \
    "${small[@]}" --steps 4 --recipe bf16 --resume --checkpoint-dir "$work/c"
  train4 "${small[@]}" --steps 2 --recipe bf16 --checkpoint-dir "$work/b" >/dev/null 2>&1 ||
    fail "save bf16"
  expect "saved under the 'bf16' recipe" "${small[@]}" --steps 4 --resume \
    --checkpoint-dir "$work/b"
  expect "saved under the 'delayed' recipe, but this LayerContext's recipe is 'block'" \
    "${small[@]}" --steps 4 --recipe block --resume --checkpoint-dir "$work/c"
  train4 "${small[@]}" --steps 2 --recipe block --checkpoint-dir "$work/k" >/dev/null 2>&1 ||
    fail "save block"
  expect "saved under the 'block' recipe" "${small[@]}" --steps 4 --resume \
    --checkpoint-dir "$work/k"
  expect "cuts a 128-wide scaling block" --dp 2 --tp 2 --layers 1 --hidden 64 --ffn 192 \
    --seq 32 --batch 4 --steps 2 --recipe block
  printf 'garbage' | dd of="$work/c/step-2/rank-1.tensors" bs=1 seek=100 conv=notrunc 2>/dev/null
  expect "corrupted (checksum mismatch)" "${small[@]}" --steps 4 --resume --checkpoint-dir "$work/c"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
echo "PASS: $case_name"
