#!/usr/bin/env bash
# The README's example of extra arguments, `launch/demo.sh --steps N`, run against an
# existing build tree (QMESH_DEMO_BUILD_DIR): both runs must end after N steps (the extra
# --steps replaces the demo's own), each with a final loss, and the plot must be written.
# A demo option given twice, or a demo-owned option, must be refused with a clear message;
# --help must print the usage without installing, building or running anything.
# Usage: demo_test.sh <source dir> <build dir>
set -uo pipefail
src=$1 build=$2
steps=4
fail() { echo "FAIL: $*"; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
QMESH_DEMO_BUILD_DIR=$build timeout 600 "$src/launch/demo.sh" --steps $steps --log-every 2 \
  >"$log" 2>&1 || { cat "$log"; fail "launch/demo.sh --steps $steps exited non-zero"; }
for run in fp8_delayed bf16; do
  f=$build/demo/$run.log
  grep -q ", $steps steps$" "$f" || { cat "$f"; fail "$run: the run did not take --steps $steps"; }
  grep -q "^step *$steps " "$f" || fail "$run: no log line for step $steps"
  grep -q "^final loss" "$f" || fail "$run: no final loss"
done
[ -s "$build/demo/loss.png" ] || fail "no plot at $build/demo/loss.png"
QMESH_DEMO_BUILD_DIR=$build timeout 60 "$src/launch/demo.sh" --recipe bf16 >"$log" 2>&1 &&
  fail "--recipe was accepted (the demo sets it)"
grep -q "is set by the demo itself" "$log" || { cat "$log"; fail "no clear message for --recipe"; }
QMESH_DEMO_BUILD_DIR=/nonexistent timeout 10 "$src/launch/demo.sh" --steps 3 --help >"$log" 2>&1 ||
  { cat "$log"; fail "--help exited non-zero"; }
grep -q "^Usage: launch/demo.sh" "$log" && ! grep -q "===" "$log" ||
  { cat "$log"; fail "--help did not print only the usage"; }
echo "demo_test: PASS"
