#!/usr/bin/env bash
# Builds qmesh for Hopper and runs the GPU tests and benchmarks, on a machine that has a GPU
# and the CUDA toolkit but maybe no MPI, UCX, OpenBLAS, Boost or GoogleTest.
# GoogleTest comes from a source copy in third_party/googletest (git-ignored):
#   cp -r /usr/src/googletest third_party/googletest     # on a machine that has it
# Results (logs, JSON) go to $OUT if set, else build-gpu/results; summary.json lists every
# step's outcome, each test program's verdict and the JSON files written.
#
# Usage: launch/gpu_check.sh [STEP] [TEST_REGEX]
#   driver  checks that the driver supports the toolkit's CUDA version (a few seconds)
#   build   configures and builds the GPU tests and benchmarks in build-gpu (minutes; a
#           build-gpu already built, e.g. carried to the machine, is only brought up to date)
#   tests   runs the GPU test programs (those matching TEST_REGEX if given), 180 s each at most
#   bench   runs the GPU benchmarks (those whose name matches TEST_REGEX if given), 240 s each
#           at most
#   profile Nsight Compute (ncu): LaunchStats, Occupancy and MemoryWorkloadAnalysis of the
#           cast_transpose kernel at 8192 x 8192 (bf16 and fp32 -> e4m3) and of the
#           norm_forward kernel at 8192 x 4096, and the GEMM vs non-GEMM time of one
#           LayerNormMLP step per recipe (skipped without ncu)
#   sanitize compute-sanitizer (memcheck, racecheck, synccheck) over the GPU test programs
#           matching TEST_REGEX (all if none), 240 s each at most; not part of check or all
#   jaxtests builds the XLA FFI handlers against the machine's jax (needs build's configure),
#           runs tests/jax/test_{cuda,command_buffers,collective_gemm_gpu}.py and the NCCL
#           communicator test, a process each, and pip's check of the package (1.5 minutes)
#   jaxbench flax_layer_bench, with ncu the kernel time of one layer step per category (bf16,
#           flax_fp8, qmesh_delayed: ncu-flax.json), jax_ops_bench, collective_gemm_bench on
#           one GPU (about 7 minutes; what the budget leaves no room for is skipped)
#   jax     jaxtests, then jaxbench
#   all     (default) driver, build, tests, jaxtests, bench, profile, jaxbench, in that order
#   check   the same as all: the whole check (CUDA and JAX), more than one call's budget
#   part1   driver, build, tests, jaxtests, bench, profile (about 7 minutes on an H100) and
#   part2   jaxbench (on the same machine, which keeps build-gpu): the check in two calls
# QMESH_GPU_CHECK_BUDGET_S (default 540) bounds the whole call: a step that would not fit in
# what is left is skipped and says so, and the per-program timeouts shrink to fit.
# Each step is one call, so that a machine lent for 10 minutes a call can run them one by
# one; tests and bench need build's output. --tests-only and --bench-only are the old names
# of build+tests and build+bench.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-gpu/results}
mkdir -p "$out"
step=${1:-all}
test_regex=${2:-}
export PYTHONUNBUFFERED=1
case $step in
  -h | --help)
    sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  --tests-only) steps="driver build tests" ;;
  --bench-only) steps="driver build bench" ;;
  driver | build | tests | bench | profile | sanitize | jaxtests | jaxbench) steps=$step ;;
  jax) steps="jaxtests jaxbench" ;;
  all | check) steps="driver build tests jaxtests bench profile jaxbench" ;;
  part1) steps="driver build tests jaxtests bench profile" ;;
  part2) steps="jaxbench" ;;
  *)
    echo "gpu_check: unknown step '$step'; expected driver, build, tests, bench, profile," \
      "sanitize, jaxtests, jaxbench, jax, all, check, part1 or part2 (--help)" >&2
    exit 2
    ;;
esac
has_step() { [[ " $steps " == *" $1 "* ]]; }

# The time budget of this call, and what each step did (for summary.json).
budget=${QMESH_GPU_CHECK_BUDGET_S:-540}
left() { echo $((budget - SECONDS)); }
# A timeout of at most $1 seconds that leaves $2 seconds of the budget for what follows.
bounded() {
  local t=$(($(left) - $2))
  [ "$t" -gt "$1" ] && t=$1
  echo $t
}
: >"$out/steps.tsv"
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$SECONDS" >>"$out/steps.tsv"; }
: >"$out/gpu-tests.tsv"
# Writes summary.json (the steps' outcomes, each test program's verdict, the JSON files
# written) and exits with status $1.
finish() {
  python3 - "$out" "$1" <<'PY'
import json, os, sys
out, status = sys.argv[1], int(sys.argv[2])
def rows(name):
    path = os.path.join(out, name)
    return [l.rstrip("\n").split("\t") for l in open(path)] if os.path.exists(path) else []
device = open(os.path.join(out, "device.txt")).read() if os.path.exists(
    os.path.join(out, "device.txt")) else ""
summary = {
    "device": device.strip(),
    "passed": status == 0,
    "steps": [{"step": s, "outcome": o, "at_s": int(t)} for s, o, t in rows("steps.tsv")],
    "tests": [{"program": p, "verdict": v, "seconds": int(t)} for p, v, t in rows("gpu-tests.tsv")],
    "json": sorted(f for f in os.listdir(out) if f.endswith(".json") and f != "summary.json"),
}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
  exit "$1"
}

# The driver must support the CUDA version of the toolkit the tests are built with; otherwise
# every CUDA call fails and the tests would only report that no GPU was seen.
if has_step driver; then
  mkdir -p build-gpu
  nvcc -o build-gpu/cuda_driver_check launch/cuda_driver_check.cpp 2>&1 | tee "$out/driver.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: could not build the driver check"; exit 1; }
  build-gpu/cuda_driver_check 2>&1 | tee -a "$out/driver.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || {
    echo "gpu_check: the CUDA driver check failed (above)"
    record driver FAILED
    finish 1
  }
  record driver passed
fi

if has_step build; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    nvcc --version | tail -n 2
    date -u +%Y-%m-%dT%H:%MZ
  } 2>&1 | tee "$out/device.txt"

  # NCCL: the CUDA toolkit's if it has one, else the nvidia-nccl wheel that PyTorch brings,
  # else no NCCL backend (its tests are then not built; the report says so).
  nccl_args=()
  toolkit=$(dirname "$(dirname "$(command -v nvcc)")")
  if [ -z "${NCCL_ROOT:-}" ] && [ ! -f "$toolkit/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
    wheel=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
    if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then
      nccl_args=(-DNCCL_ROOT="$wheel")
    else
      nccl_args=(-DQMESH_WITH_NCCL=OFF)
    fi
  fi
  echo "NCCL: ${nccl_args[*]:-from the CUDA toolkit}" | tee -a "$out/device.txt"

  # The device's own architecture (9.0 -> 90a, 10.0 -> 100a), so that qmesh's kernels load on
  # it; QMESH_CUDA_ARCH overrides it, and 90a is taken when nvidia-smi cannot tell.
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
  arch=${QMESH_CUDA_ARCH:-$( [[ "$cc" =~ ^[0-9]+\.[0-9]$ ]] && echo "${cc/./}a" || echo 90a)}
  echo "CUDA architecture: $arch (compute capability ${cc:-unknown})" | tee -a "$out/device.txt"

  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DQMESH_WITH_CUDA=ON "${nccl_args[@]}" 2>&1 |
    tail -n 30 | tee "$out/configure.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: configure failed"; record build FAILED; finish 1; }
  # Only the GPU tests and benchmarks (and what they link): the CPU-only programs would spend
  # device time for nothing.
  cmake --build build-gpu --target gpu_checks -j "$(nproc)" 2>&1 | tail -n 40 | tee "$out/build.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: build failed"; record build FAILED; finish 1; }
  record build passed
fi

status=0
if has_step tests; then
  # Each GPU test binary (ctest's gpu label: the programs in tests/gpu) runs on its own, in
  # its ctest working directory, bounded by `timeout` and judged by its exit status (77: every
  # test skipped, tests/common/gtest_main.cpp). Not through ctest: `ctest --timeout` does not
  # shorten the TIMEOUT property (600 s) that every qmesh test has.
  : >"$out/gpu-tests.log"
  tests=$(ctest --test-dir build-gpu -L gpu -N ${test_regex:+-R "$test_regex"} |
    sed -n 's/^ *Test *#[0-9]*: *//p')
  [ -n "$tests" ] || { echo "gpu_check: no GPU tests were configured" | tee -a "$out/gpu-tests.log"; status=1; }
  for t in $tests; do
    # Leave 150 s of the budget for the benchmarks and the profile after the tests.
    limit=$(bounded 180 150)
    if [ "$limit" -lt 20 ]; then
      echo "=== $t: SKIPPED (time budget spent)" | tee -a "$out/gpu-tests.log"
      printf '%s\t%s\t%s\n' "$t" "skipped (budget)" 0 >>"$out/gpu-tests.tsv"
      status=1
      continue
    fi
    echo "=== $t" | tee -a "$out/gpu-tests.log"
    t0=$SECONDS
    (cd build-gpu/tests/gpu && timeout -k 10 "$limit" "./$t" --gtest_brief=1) 2>&1 |
      tee "$out/$t.log"
    rc=${PIPESTATUS[0]}
    cat "$out/$t.log" >>"$out/gpu-tests.log"
    case $rc in
      0) verdict=passed ;;
      77) verdict="NOTHING RAN (every test skipped: no GPU seen, which is a failure here)" ;;
      124 | 137) verdict="TIMED OUT ($limit s)" ;;
      *) verdict="FAILED (exit status $rc)" ;;
    esac
    echo "=== $t: $verdict" | tee -a "$out/gpu-tests.log"
    printf '%s\t%s\t%s\n' "$t" "$verdict" $((SECONDS - t0)) >>"$out/gpu-tests.tsv"
    [ "$rc" -eq 0 ] || status=1
  done
  record tests "$([ $status -eq 0 ] && echo passed || echo FAILED)"
fi
if has_step bench; then
  # Every GPU benchmark program writes a table to stdout and JSON next to it: dense_gpu_bench
  # (LayerNormMLP: BF16 with fp32 and with bf16 activations, FP8 delayed, current, block), quant_gpu_bench (the casts against the copy
  # bandwidth), gemm_epilogue_gpu_bench (what cuBLASLt offers for the FP8 first GEMM),
  # gemm_block_gpu_bench (which block-scaled FP8 GEMMs run, against BF16; about a minute),
  # gemm_gpu_bench, cgemm_gpu_bench (collective GEMMs); the first ones matter most.
  for name in dense_gpu_bench quant_gpu_bench gemm_epilogue_gpu_bench gemm_block_gpu_bench \
    gemm_gpu_bench cgemm_gpu_bench; do
    b=build-gpu/bench/$name
    [ -x "$b" ] || continue
    [[ -z "$test_regex" || $name =~ $test_regex ]] || continue
    limit=$(bounded 240 60)  # 60 s for the profile
    if [ "$limit" -lt 20 ]; then
      echo "=== $name: SKIPPED (time budget spent)"
      record "bench $name" "skipped (budget)"
      continue
    fi
    echo "=== $name"
    timeout "$limit" "$b" --json "$out/$name.json" 2>&1 | tee "$out/$name.txt"
    rc=${PIPESTATUS[0]}
    record "bench $name" "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (exit status $rc)")"
  done
  if python3 -c "import torch" 2>/dev/null && [ -f bench/gemm_torch.py ] && [ "$(left)" -gt 120 ]; then
    echo "=== gemm_torch.py"
    timeout "$(bounded 240 60)" python3 bench/gemm_torch.py --json "$out/gemm_torch.json" 2>&1 |
      tee "$out/gemm_torch.txt"
  fi
fi
if has_step sanitize; then
  # Each tool over each GPU test program (built by the build step): memory errors, shared
  # memory races, invalid synchronization. Verdicts in sanitize.tsv (summary.json's steps).
  tests=$(ctest --test-dir build-gpu -L gpu -N ${test_regex:+-R "$test_regex"} |
    sed -n 's/^ *Test *#[0-9]*: *//p')
  for tool in memcheck racecheck synccheck; do
    for t in $tests; do
      limit=$(bounded 240 10)
      [ "$limit" -ge 20 ] || { record "sanitize $tool $t" "skipped (budget)"; continue; }
      (cd build-gpu/tests/gpu && timeout -k 10 "$limit" compute-sanitizer --tool "$tool" \
        --error-exitcode 99 "./$t" --gtest_brief=1) >"$out/sanitize-$tool-$t.log" 2>&1
      rc=$?
      case $rc in
        0) verdict=clean ;;
        99) verdict="ERRORS (see sanitize-$tool-$t.log)" ;;
        124 | 137) verdict="TIMED OUT ($limit s)" ;;
        *) verdict="FAILED (exit status $rc)" ;;
      esac
      echo "=== compute-sanitizer $tool $t: $verdict"
      record "sanitize $tool $t" "$verdict"
      [ "$rc" -eq 0 ] || status=1
    done
  done
fi
if has_step profile; then
  if ! command -v ncu >/dev/null; then
    echo "gpu_check: no ncu (Nsight Compute) on PATH; profile skipped"
    record profile "skipped (no ncu)"
  elif [ "$(left)" -lt 60 ]; then
    echo "gpu_check: profile skipped (time budget spent)"
    record profile "skipped (budget)"
  elif [ ! -x build-gpu/bench/quant_gpu_bench ]; then
    echo "gpu_check: profile needs the build step's benchmarks"
    record profile FAILED
    status=1
  else
    # The cast kernel: launch configuration, occupancy (registers, blocks per SM) and memory
    # throughput, for the two launches (warm-up, timed) of each 8192 x 8192 e4m3 case.
    timeout "$(bounded 120 30)" ncu --section LaunchStats --section Occupancy \
      --section MemoryWorkloadAnalysis --kernel-name regex:cast_tiled_kernel --csv \
      build-gpu/bench/quant_gpu_bench --case "e4m3 8192x8192" >"$out/ncu-cast.csv" 2>"$out/ncu-cast.log"
    record "profile cast" "$([ $? -eq 0 ] && echo passed || echo FAILED)"
    # The same sections for the norm kernel (norm_forward: LayerNorm fused with the cast and
    # its columnwise copy, bf16 and fp32 -> e4m3 at 8192 x 4096): the sectors its stores take.
    timeout "$(bounded 60 30)" ncu --section LaunchStats --section Occupancy \
      --section MemoryWorkloadAnalysis --kernel-name regex:norm_kernel --csv \
      build-gpu/bench/quant_gpu_bench --case "norm_forward" >"$out/ncu-norm.csv" 2>"$out/ncu-norm.log"
    record "profile norm" "$([ $? -eq 0 ] && echo passed || echo FAILED)"
    # Per recipe, every kernel of 3 steps (2 warm-up, 1 timed), serialized: the GEMM share.
    for recipe in bf16:fp32 bf16 delayed current block; do
      [ "$(left)" -gt 40 ] || { record "profile $recipe" "skipped (budget)"; continue; }
      timeout "$(bounded 90 10)" ncu --metrics gpu__time_duration.sum --csv \
        build-gpu/bench/dense_gpu_bench --iters 1 --recipes "$recipe" \
        >"$out/ncu-step-$recipe.csv" 2>"$out/ncu-step-$recipe.log"
      record "profile $recipe" "$([ $? -eq 0 ] && echo passed || echo FAILED)"
    done
    python3 launch/ncu_summary.py "$out" >"$out/ncu.json" || status=1
  fi
fi
# The JAX steps. The configure of `build` found the jax of the python3 on PATH
# (cmake/QmeshJax.cmake); the handler library is built against its FFI headers and loaded
# from the build tree. jax_ready builds it once per call (jax-versions.txt, jax-build.log) and
# says whether the JAX steps can run.
jax_prepared=""
jax_ready() {
  if [ -n "$jax_prepared" ]; then [ "$jax_prepared" = yes ]; return; fi
  jax_prepared=no
  if ! grep -q '^QMESH_WITH_JAX:BOOL=ON' build-gpu/CMakeCache.txt 2>/dev/null; then
    echo "gpu_check: no JAX build (run the build step first, with a python3 that has jax)"
    return 1
  fi
  python3 -c 'import sys, jax, jaxlib, flax
print("python", sys.version.split()[0], "jax", jax.__version__, "jaxlib", jaxlib.__version__,
      "flax", flax.__version__); print(jax.devices())' 2>&1 | tee "$out/jax-versions.txt"
  cmake --build build-gpu --target qmesh_jax_ffi -j "$(nproc)" 2>&1 | tail -n 5 |
    tee "$out/jax-build.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: the JAX handler library did not build"; return 1; }
  export QMESH_JAX_LIBRARY_DIR=$PWD/build-gpu/src PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
  # The layer benchmark's executables go into JAX's persistent compilation cache (kept in
  # build-gpu), so that its profile loads the very executables timed instead of compiling.
  export JAX_COMPILATION_CACHE_DIR=$PWD/build-gpu/jax-cache
  jax_prepared=yes
}
# Whether the JAX step $1 can run; else it is recorded as skipped (too little of the budget
# left) or failed (no JAX build).
jax_step_runs() {
  if [ "$(left)" -lt 60 ]; then
    record "$1" "skipped (budget)"
    return 1
  fi
  jax_ready && return 0
  record "$1" FAILED
  status=1
  return 1
}

if has_step jaxtests; then
  # CUDA vs CPU handlers, command buffers, the collective GEMMs over a one-rank NCCL
  # communicator (jax-tests.log), and pip's check of the package against this jax
  # (pip-check.log). About a minute and a half on an H100 with the handler library's build.
  if jax_step_runs jaxtests; then
    jax_status=0
    # Each file in its own process, so that a crash in one does not hide the others' verdicts.
    : >"$out/jax-tests.log"
    for f in tests/jax/test_cuda.py tests/jax/test_command_buffers.py \
      tests/jax/test_collective_gemm_gpu.py \
      tests/jax/test_collective_gemm_across.py::test_nccl_communicator_on_one_gpu; do
      echo "=== $f" | tee -a "$out/jax-tests.log"
      timeout "$(bounded 90 20)" python3 -m pytest -v -p no:cacheprovider --durations=5 "$f" 2>&1 |
        tee -a "$out/jax-tests.log"
      rc=${PIPESTATUS[0]}
      record "jax $f" "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (exit status $rc)")"
      [ "$rc" -eq 0 ] || jax_status=1
    done
    # The package accepts this jax: pip resolves python/pyproject.toml against the installed
    # jax without a registry and without building (the full install is
    # `pip install --no-build-isolation ./python`, minutes: it builds qmesh for this GPU).
    timeout "$(bounded 60 20)" python3 -m pip install --dry-run --no-index --no-build-isolation ./python 2>&1 |
      tail -n 5 | tee "$out/pip-check.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || jax_status=1
    record jaxtests "$([ $jax_status -eq 0 ] && echo passed || echo FAILED)"
    [ $jax_status -eq 0 ] || status=1
  fi
fi

if has_step jaxbench; then
  # In the order of what matters most: the seed layer (flax_layer_bench.{txt,json},
  # flax_layer_hlo/*.hlo.txt.gz), its kernel profile (ncu-flax-*.{csv,log},
  # ncu-flax.{json,txt}), the handlers against plain JAX (jax_ops_bench.{txt,json}), the
  # collective GEMMs on one GPU (collective_gemm_bench.{txt,json}). About 7 minutes on an H100;
  # each program's timeout is bounded by what is left of the budget, so what does not fit is
  # cut off or skipped (recorded).
  if jax_step_runs jaxbench; then
    jax_status=0
    # The seed transformer layer: BF16, Flax FP8, qmesh drop-in (delayed, current), qmesh
    # modules, the delayed drop-in without reporting.
    timeout "$(bounded 240 5)" python3 bench/flax_layer_bench.py --warmup 2 --steps 20 \
      --json "$out/flax_layer_bench.json" --hlo-dir "$out/flax_layer_hlo" 2>&1 |
      tee "$out/flax_layer_bench.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || jax_status=1
    gzip -f "$out"/flax_layer_hlo/*.hlo.txt 2>/dev/null
    # Where the layer step's kernel time goes: ncu records one step per variant (after the
    # warm-up, between cudaProfilerStart and Stop: no compiling, no autotuning) into
    # ncu-flax-VARIANT.csv; launch/ncu_layer_summary.py splits it into qmesh, attention, GEMM,
    # copy, XLA fusion and other kernels (ncu-flax.json, ncu-flax.txt). Three variants, a
    # process each (under a minute each): bf16, flax_fp8 and qmesh_delayed are the same
    # layer with only the Dense GEMMs swapped (XLA's BF16; XLA's FP8 and qmesh's FP8, both
    # under delayed scaling), so what differs between them is the FP8 path's own cost.
    if ! command -v ncu >/dev/null; then
      echo "gpu_check: no ncu (Nsight Compute) on PATH; the layer profile skipped"
      record "jax profile" "skipped (no ncu)"
    else
      csvs=()
      for v in bf16 flax_fp8 qmesh_delayed; do
        [ "$(left)" -ge 60 ] || { record "jax profile $v" "skipped (budget)"; continue; }
        echo "=== ncu: flax_layer_bench $v"
        timeout "$(bounded 150 5)" ncu --profile-from-start off --metrics gpu__time_duration.sum \
          --csv python3 bench/flax_layer_bench.py --variants "$v" --warmup 1 --steps 1 \
          --profile-steps 1 >"$out/ncu-flax-$v.csv" 2>"$out/ncu-flax-$v.log"
        rc=$?
        record "jax profile $v" "$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit status $rc)")"
        [ $rc -eq 0 ] && csvs+=("$out/ncu-flax-$v.csv")
      done
      if [ ${#csvs[@]} -gt 0 ]; then
        python3 launch/ncu_layer_summary.py --steps 1 --json "$out/ncu-flax.json" "${csvs[@]}" \
          2>&1 | tee "$out/ncu-flax.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || jax_status=1
      fi
    fi
    # Handlers vs plain JAX at a size that fills the GPU; the GEMMs also at two of
    # gemm_gpu_bench's shapes, with its bf16 D (FFI vs C++ at the same shape and output).
    if [ "$(left)" -ge 40 ]; then
      timeout "$(bounded 120 10)" python3 bench/jax_ops_bench.py --rows 16384 --cols 8192 --n 8192 \
        --iters 3 --reps 10 --gemm 8192x8192x8192 --gemm 8192x16384x4096 \
        --json "$out/jax_ops_bench.json" 2>&1 | tee "$out/jax_ops_bench.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || jax_status=1
    else
      record "jax_ops_bench" "skipped (budget)"
    fi
    # The sequence-parallel LayerNormMLP on one GPU: XLA's collectives against the one-rank
    # NCCL rings (the overlap of several GPUs needs several GPUs).
    if [ "$(left)" -ge 40 ]; then
      timeout "$(bounded 90 5)" python3 bench/collective_gemm_bench.py --platform gpu --tp 1 \
        --seq 8192 --hidden 4096 --ffn 16384 --steps 10 --warmup 2 \
        --json "$out/collective_gemm_bench.json" 2>&1 | tee "$out/collective_gemm_bench.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || jax_status=1
    else
      record "collective_gemm_bench" "skipped (budget)"
    fi
    record jaxbench "$([ $jax_status -eq 0 ] && echo passed || echo FAILED)"
    [ $jax_status -eq 0 ] || status=1
  fi
fi
finish "$status"
