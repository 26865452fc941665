#!/usr/bin/env bash
# The minimal trainer shown in README.md and docs/trainer.md is, character for character, the
# program tests/package/main.cpp that CI builds against the installed package and runs: the
# ```c++ block of each page that holds "int train(" must equal that file.
# Usage: trainer_documented.sh <repository root>
set -euo pipefail
cd "$1"
status=0
for page in README.md docs/trainer.md; do
  shown=$(awk '/^```c\+\+$/ {block = ""; inside = 1; next}
               /^```$/ && inside {inside = 0; if (block ~ /int train\(/) printf "%s", block; next}
               inside {block = block $0 "\n"}' "$page")
  if [ -z "$shown" ]; then
    echo "FAIL: $page shows no minimal trainer (a c++ block with 'int train(')"
    status=1
  elif ! diff <(printf '%s\n' "$shown") tests/package/main.cpp >/dev/null; then
    echo "FAIL: the trainer in $page differs from tests/package/main.cpp:"
    diff <(printf '%s\n' "$shown") tests/package/main.cpp || true
    status=1
  fi
done
[ $status -eq 0 ] && echo "PASS: README.md and docs/trainer.md show tests/package/main.cpp"
exit $status
