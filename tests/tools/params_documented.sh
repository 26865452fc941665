#!/usr/bin/env bash
# Every environment tunable the code reads (qmesh::param_* / QMESH_PARAM with a literal
# name, and os.environ reads of QMESH_* names in python/) must have a row in docs/params.md, and every row must name a variable that some
# code reads. Usage: params_documented.sh <repository root>
set -euo pipefail
cd "$1"
used=$(grep -rhoE 'param_(int|double|string)\("[A-Z0-9_]+"|QMESH_PARAM\([a-z_]+, "[A-Z0-9_]+"' \
         src comm include examples bench launch 2>/dev/null |
       sed -E 's/.*"([A-Z0-9_]+)"$/QMESH_\1/' | grep -v '^QMESH_NAME$'
       grep -rhoE 'environ(\.get)?[(\[]"QMESH_[A-Z0-9_]+"' python 2>/dev/null |
         sed -E 's/.*"(QMESH_[A-Z0-9_]+)"$/\1/')
used=$(sort -u <<<"$used")
documented=$(grep -oE '^\| `QMESH_[A-Z0-9_]+`' docs/params.md | tr -d '|` ' | sort -u)
status=0
for v in $used; do
  grep -qx "$v" <<<"$documented" || { echo "FAIL: $v is read by the code but not in docs/params.md"; status=1; }
done
for v in $documented; do
  grep -qx "$v" <<<"$used" || grep -rq "$v" launch ||
    { echo "FAIL: docs/params.md lists $v, which nothing reads"; status=1; }
done
[ $status -eq 0 ] && echo "PASS: $(wc -w <<<"$used") tunables, all documented"
exit $status
