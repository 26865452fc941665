#!/bin/bash
# Runs a libFuzzer target for <seconds> on a copy of <corpus dir> (the tree's corpus is not
# written to) and fails on any crash, leak or sanitizer report; the reproducer is kept in
# the work directory it prints. Usage: run_fuzz.sh <fuzz target> <corpus dir> <seconds>
set -u
target=$(realpath "$1") corpus=$2 seconds=$3
[ -x "$target" ] || { echo "run_fuzz: no fuzz target $1" >&2; exit 2; }
work=$(mktemp -d /tmp/qmesh-fuzz.XXXXXX)
cp -r "$corpus" "$work/corpus"
cd "$work"
if "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    corpus >fuzz.log 2>&1; then
  tail -12 fuzz.log
  rm -rf "$work"
  exit 0
fi
tail -40 fuzz.log
echo "run_fuzz: FAIL: $(basename "$target") found a bug; reproducer and log in $work"
exit 1
