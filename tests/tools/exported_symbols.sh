#!/usr/bin/env bash
# Checks what qmesh's shared libraries export (nm -D): libqmesh_c exactly the functions
# that include/qmesh/c_api.h declares; every C++ library only names of the public qmesh::
# namespace (no standard-library template instantiations or other internals).
# Usage: exported_symbols.sh <c_api.h> <libqmesh_c.so> <C++ library.so>...
set -uo pipefail
header=$1
c_lib=$2
shift 2
status=0
defined() { nm -D --defined-only "$@" | awk 'NF == 3 && $2 != "A" { print $3 }'; }

declared=$(tr '\n' ' ' <"$header" | grep -oP 'QMESH_C_EXPORT[^;{(]*\bqmesh_\w+(?=\s*\()' |
  grep -oP 'qmesh_\w+$' | sort -u)
exported=$(defined "$c_lib" | sort -u)
[ -n "$declared" ] || { echo "FAIL: no QMESH_C_EXPORT declarations found in $header"; exit 1; }
if [ "$declared" != "$exported" ]; then
  echo "FAIL: $c_lib exports other symbols than $header declares:"
  diff <(echo "$declared") <(echo "$exported") | sed 's/^</  declared, not exported:/; s/^>/  exported, not declared:/'
  status=1
else
  echo "ok: $c_lib exports the $(echo "$declared" | wc -l) functions of $(basename "$header")"
fi

public='^(qmesh::|typeinfo for qmesh::|typeinfo name for qmesh::|vtable for qmesh::|VTT for qmesh::|non-virtual thunk to qmesh::|virtual thunk to qmesh::|guard variable for qmesh::)'
for lib in "$@"; do
  others=$(defined "$lib" | c++filt | grep -vE "$public")
  if [ -n "$others" ]; then
    echo "FAIL: $lib exports names outside the qmesh:: namespace:"
    echo "$others" | head -n 20 | sed 's/^/  /'
    status=1
  else
    echo "ok: $lib exports $(defined "$lib" | wc -l) names, all in qmesh::"
  fi
done
exit $status
