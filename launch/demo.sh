#!/usr/bin/env bash
# The main job: installs what is missing, builds qmesh in build/, then trains train_mlp
# under mpirun with 4 ranks (dp 2 x tp 2), first with FP8 delayed scaling, then with BF16
# GEMMs, and plots both loss curves. Runs on the CPU backend (no GPU needed).
# Usage: launch/demo.sh [extra train_mlp options, e.g. --steps 300]
# Extra options replace the demo's own value of the same option (--dp or --tp replaces
# both; train_mlp's default --dp is the ranks / --tp). --recipe, --csv, --plot and
# --compare belong to the demo's two runs and cannot be given.
# QMESH_DEMO_BUILD_DIR: build in this already configured tree (as it is configured)
# instead of configuring build/ for Release; the tests use it.
# -h, --help: this text (train_mlp's own options: build/examples/train_mlp/train_mlp --help).
set -euo pipefail
cd "$(dirname "$0")/.."

defaults=(--dp 2 --tp 2 --layers 2 --hidden 256 --ffn 1024 --seq 64 --batch 8 --steps 100
          --log-every 20)
# given <option>...: true when the extra arguments name one of the options
# (as "--name value" or "--name=value").
given() {
  local arg opt
  for arg in "${extra[@]}"; do
    for opt in "$@"; do
      [[ $arg == "$opt" || $arg == "$opt="* ]] && return 0
    done
  done
  return 1
}
extra=("$@")
if given -h --help; then
  sed -n '2,11p' launch/demo.sh | sed 's/^# \{0,1\}//'
  exit 0
fi
for opt in --recipe --csv --plot --compare; do
  if given "$opt"; then
    echo "launch/demo.sh: $opt is set by the demo itself (an FP8 delayed-scaling run, then" \
      "a BF16 run, plotted together); for other recipes run" \
      "launch/qmeshrun -np 4 build/examples/train_mlp/train_mlp $opt ..." >&2
    exit 2
  fi
done
common=()
for ((i = 0; i < ${#defaults[@]}; i += 2)); do
  opt=${defaults[i]}
  case $opt in
    --dp | --tp) given --dp --tp && continue ;;
    *) given "$opt" && continue ;;
  esac
  common+=("$opt" "${defaults[i + 1]}")
done
common+=("${extra[@]}")

launch/install_deps.sh
build=${QMESH_DEMO_BUILD_DIR:-build}
if [ -n "${QMESH_DEMO_BUILD_DIR:-}" ]; then
  [ -f "$build/CMakeCache.txt" ] ||
    { echo "launch/demo.sh: QMESH_DEMO_BUILD_DIR=$build is not a configured build tree" >&2; exit 2; }
  echo "=== build ($build/)"
else
  mkdir -p build
  echo "=== configure and build (build/)"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >build/configure.log 2>&1 ||
    { cat build/configure.log; exit 1; }
fi
cmake --build "$build" -j "$(nproc)" --target train_mlp

train=$build/examples/train_mlp/train_mlp
out=$build/demo
mkdir -p "$out"
echo
echo "=== FP8 (delayed scaling), dp 2 x tp 2"
launch/qmeshrun -np 4 "$train" "${common[@]}" --recipe delayed \
  --csv "$out/fp8_delayed.csv" | tee "$out/fp8_delayed.log"
echo
echo "=== BF16, same configuration"
launch/qmeshrun -np 4 "$train" "${common[@]}" --recipe bf16 \
  --csv "$out/bf16.csv" --plot "$out/loss.png" --compare "$out/fp8_delayed.csv" |
  tee "$out/bf16.log"

echo
echo "=== summary"
fp8=$(grep '^final loss' "$out/fp8_delayed.log" | awk '{print $3}')
bf16=$(grep '^final loss' "$out/bf16.log" | awk '{print $3}')
base=$(grep '^loss of predicting the mean' "$out/bf16.log" | awk '{print $NF}')
echo "final loss, FP8 delayed scaling: $fp8"
echo "final loss, BF16:                $bf16"
echo "loss of predicting the mean:     $base"
echo "loss curves: $out/loss.png"
