#!/usr/bin/env bash
# Builds qmesh for Hopper and runs the GPU tests and benchmarks, on a machine that has a GPU
# and the CUDA toolkit but maybe no MPI, UCX, OpenBLAS, Boost or GoogleTest.
# GoogleTest comes from a source copy in third_party/googletest (git-ignored):
#   cp -r /usr/src/googletest third_party/googletest     # on a machine that has it
# Results (logs, JSON) go to $OUT if set, else build-gpu/results.
#
# Usage: launch/gpu_check.sh [STEP] [TEST_REGEX]
#   driver  checks that the driver supports the toolkit's CUDA version (a few seconds)
#   build   configures and builds the GPU tests and benchmarks in build-gpu (minutes)
#   tests   runs the GPU test programs (those matching TEST_REGEX if given), 180 s each at most
#   bench   runs the GPU benchmarks, 240 s each at most
#   jax     builds the XLA FFI handlers against the machine's jax (needs build's configure),
#           runs tests/jax/test_{cuda,command_buffers}.py, jax_ops_bench, flax_layer_bench
#   all     (default) driver, build, tests, bench, jax, in that order
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
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  --tests-only) steps="driver build tests" ;;
  --bench-only) steps="driver build bench" ;;
  driver | build | tests | bench | jax) steps=$step ;;
  all) steps="driver build tests bench jax" ;;
  *)
    echo "gpu_check: unknown step '$step'; expected driver, build, tests, bench or all (--help)" >&2
    exit 2
    ;;
esac
has_step() { [[ " $steps " == *" $1 "* ]]; }

# The driver must support the CUDA version of the toolkit the tests are built with; otherwise
# every CUDA call fails and the tests would only report that no GPU was seen.
if has_step driver; then
  mkdir -p build-gpu
  nvcc -o build-gpu/cuda_driver_check launch/cuda_driver_check.cpp 2>&1 | tee "$out/driver.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: could not build the driver check"; exit 1; }
  build-gpu/cuda_driver_check 2>&1 | tee -a "$out/driver.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: the CUDA driver check failed (above)"; exit 1; }
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

  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DQMESH_WITH_CUDA=ON "${nccl_args[@]}" 2>&1 |
    tail -n 30 | tee "$out/configure.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: configure failed"; exit 1; }
  # Only the GPU tests and benchmarks (and what they link): the CPU-only programs would spend
  # device time for nothing.
  cmake --build build-gpu --target gpu_checks -j "$(nproc)" 2>&1 | tail -n 40 | tee "$out/build.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: build failed"; exit 1; }
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
    echo "=== $t" | tee -a "$out/gpu-tests.log"
    (cd build-gpu/tests/gpu && timeout -k 10 180 "./$t" --gtest_brief=1) 2>&1 |
      tee "$out/$t.log"
    rc=${PIPESTATUS[0]}
    cat "$out/$t.log" >>"$out/gpu-tests.log"
    case $rc in
      0) verdict=passed ;;
      77) verdict="NOTHING RAN (every test skipped: no GPU seen, which is a failure here)" ;;
      124 | 137) verdict="TIMED OUT (180 s)" ;;
      *) verdict="FAILED (exit status $rc)" ;;
    esac
    echo "=== $t: $verdict" | tee -a "$out/gpu-tests.log"
    [ "$rc" -eq 0 ] || status=1
  done
fi
if has_step bench; then
  # Every GPU benchmark program writes a table to stdout and JSON next to it: gemm_gpu_bench,
  # quant_gpu_bench, cgemm_gpu_bench (collective GEMMs), dense_gpu_bench (LayerNormMLP BF16
  # vs FP8 delayed).
  for b in build-gpu/bench/*_gpu_bench; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    echo "=== $name"
    timeout 240 "$b" --json "$out/$name.json" 2>&1 | tee "$out/$name.txt"
  done
  if python3 -c "import torch" 2>/dev/null && [ -f bench/gemm_torch.py ]; then
    echo "=== gemm_torch.py"
    timeout 240 python3 bench/gemm_torch.py --json "$out/gemm_torch.json" 2>&1 |
      tee "$out/gemm_torch.txt"
  fi
fi
if has_step jax; then
  # The configure of `build` found the jax of the python3 on PATH (cmake/QmeshJax.cmake); the
  # handler library is built against its FFI headers and loaded from the build tree. Writes
  # jax-versions.txt, jax-tests.log (CUDA vs CPU handlers, command buffers), pip-check.log,
  # jax_ops_bench.{txt,json}, flax_layer_bench.{txt,json} and flax_layer_hlo/*.hlo.txt.gz
  # (the optimized HLO of each layer variant). About 3 minutes on an H100 when `build` ran.
  if ! grep -q '^QMESH_WITH_JAX:BOOL=ON' build-gpu/CMakeCache.txt 2>/dev/null; then
    echo "gpu_check: no JAX build (run the build step first, with a python3 that has jax)"
    status=1
  else
    python3 -c 'import sys, jax, jaxlib, flax
print("python", sys.version.split()[0], "jax", jax.__version__, "jaxlib", jaxlib.__version__,
      "flax", flax.__version__); print(jax.devices())' 2>&1 | tee "$out/jax-versions.txt"
    cmake --build build-gpu --target qmesh_jax_ffi -j "$(nproc)" 2>&1 | tail -n 5 |
      tee "$out/jax-build.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: the JAX handler library did not build"; status=1; }
    export QMESH_JAX_LIBRARY_DIR=$PWD/build-gpu/src PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/jax/test_cuda.py \
      tests/jax/test_command_buffers.py 2>&1 | tee "$out/jax-tests.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    # The package accepts this jax: pip resolves python/pyproject.toml against the installed
    # jax without a registry and without building (the full install is
    # `pip install --no-build-isolation ./python`, minutes: it builds qmesh for this GPU).
    timeout 60 python3 -m pip install --dry-run --no-index --no-build-isolation ./python 2>&1 |
      tail -n 5 | tee "$out/pip-check.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    # Handlers vs plain JAX at a size that fills the GPU; the GEMMs also at two of
    # gemm_gpu_bench's shapes, with its bf16 D (FFI vs C++ at the same shape and output).
    timeout 120 python3 bench/jax_ops_bench.py --rows 16384 --cols 8192 --n 8192 --iters 3 \
      --reps 10 --gemm 8192x8192x8192 --gemm 8192x16384x4096 \
      --json "$out/jax_ops_bench.json" 2>&1 | tee "$out/jax_ops_bench.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    # The seed transformer layer: BF16, Flax FP8, qmesh drop-in (delayed, current), qmesh modules.
    timeout 200 python3 bench/flax_layer_bench.py --warmup 2 --steps 20 \
      --json "$out/flax_layer_bench.json" --hlo-dir "$out/flax_layer_hlo" 2>&1 |
      tee "$out/flax_layer_bench.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    gzip -f "$out"/flax_layer_hlo/*.hlo.txt 2>/dev/null
  fi
fi
exit $status
