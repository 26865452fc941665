#!/usr/bin/env bash
# Multi-node checks on a two-node cluster of network namespaces (launch/cluster/nscluster),
# 2 ranks per node, ranks talking over TCP on the cluster's link. Exits 77 (skipped) with
# the reason where nscluster cannot run (not root, no network namespaces).
# Usage: multinode_test.sh <build dir> <case>
#   cluster    nscluster itself: up is idempotent, nodes have their own hostnames and
#              addresses and reach each other, down leaves no process behind and is idempotent
#   train      train_mlp dp 2 (across nodes) x tp 2 (inside a node), with --timing, gives
#              bitwise the parameters of the same job on one node without it; it sees two
#              hosts, tp inside one; the timing parts add up to the step time
#   tp-span    tp 4 spanning both nodes: the mesh warns; the collective-GEMM rings (ring and
#              bidir, FP8 and BF16) equal the unoverlapped path bitwise, over MPI and UCX
#   kill       a rank on node 0 is killed mid-run: every survivor, on both nodes, exits with a
#              timeout error (qmesh's, or UCX's endpoint timeout / reset naming the peer)
#              within 2 x QMESH_COMM_TIMEOUT_S, on MPI and on UCX
#   bootstrap  the NCCL unique id's exchange over the MPI and the file-store bootstraps, and
#              the hosts the mesh sees (multinode_bootstrap_test)
#   link-down  node 1's link is taken down mid-run: every rank on both nodes exits with a
#              timeout error within 2 x QMESH_COMM_TIMEOUT_S, on MPI and on UCX
set -uo pipefail
build=$1
case_name=$2
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
nscluster=$src/launch/cluster/nscluster
train=$build/examples/train_mlp/train_mlp
fail() { echo "FAIL: $*"; exit 1; }

reason=$("$nscluster" check) || { echo "SKIP: $reason"; exit 77; }
work=$(mktemp -d)
cluster=$work/cluster
trap '"$nscluster" down -d "$cluster"; rm -rf "$work"' EXIT
"$nscluster" up -d "$cluster" -n 2 || fail "could not create the cluster"
# mpirun across the two nodes, 2 ranks each, never longer than 120 s.
nsrun() { timeout 120 "$nscluster" mpirun -d "$cluster" --ppn 2 "$@"; }
small=(--layers 1 --hidden 64 --ffn 256 --seq 32 --batch 4 --steps 10 --log-every 1000)
checksums() { grep "^parameter checksums" "$1"; }
export QMESH_COMM_TIMEOUT_S=${QMESH_COMM_TIMEOUT_S:-30}

case $case_name in
cluster)
  holders=$(awk '{print $2}' "$cluster/nodes"; cat "$cluster/switch")
  "$nscluster" up -d "$cluster" -n 2 || fail "a second up"
  [ "$(awk '{print $2}' "$cluster/nodes"; cat "$cluster/switch")" = "$holders" ] ||
    fail "a second up replaced a live cluster"
  for i in 0 1; do
    h=$("$nscluster" exec -d "$cluster" $i hostname)
    [ "$h" = "qmesh-node$i" ] || fail "node $i has hostname '$h'"
  done
  [ "$(hostname)" != qmesh-node0 ] || fail "the machine's own hostname was changed"
  # Node 0 reaches node 1's address over the link (bash's /dev/tcp to a port nobody serves:
  # "connection refused" means the packet arrived).
  a1=$(awk 'NR==2{print $3}' "$cluster/nodes")
  out=$("$nscluster" exec -d "$cluster" 0 timeout 5 bash -c "echo > /dev/tcp/$a1/9" 2>&1)
  case "$out" in *"refused"*) ;; *) fail "node 0 cannot reach node 1 at $a1: $out" ;; esac
  ip -o addr | grep -q "${a1%.*}\." && fail "a cluster address appeared in the machine's namespace"
  "$nscluster" down -d "$cluster" || fail "down"
  for p in $holders; do
    [ -r "/proc/$p/stat" ] && [ "$(awk '{print $3}' "/proc/$p/stat")" != Z ] &&
      fail "process $p survived down"
  done
  "$nscluster" down -d "$cluster" || fail "a second down"
  echo "ok: 2 nodes up (idempotent), own hostnames, linked; down leaves nothing"
  ;;
train)
  for recipe in delayed bf16; do
    args=(--dp 2 --tp 2 --recipe $recipe --sequence-parallel --overlap ring "${small[@]}")
    # --timing on the 2-node run only: timing the waits changes no result.
    nsrun "$train" "${args[@]}" --timing >"$work/two.log" 2>&1 || { cat "$work/two.log"; fail "2-node run"; }
    line=$(grep "^timing: " "$work/two.log") || fail "no timing line with --timing"
    echo "$line"
    # per step T ms = compute C ms + exposed communication E ms + idle I ms: C + E + I = T.
    awk '{ t=$6; c=$10; e=$15; i=$19; d=c+e+i-t; if (d<0) d=-d;
           exit !(c>0 && e>=0 && i>=0 && d<=0.01) }' <<<"$line" ||
      fail "the timing parts do not add up to the step time: $line"
    timeout 120 "$src/launch/qmeshrun" -np 4 "$train" "${args[@]}" >"$work/one.log" 2>&1 ||
      { cat "$work/one.log"; fail "1-node run"; }
    grep -q "^hosts: 2, at most 2 ranks each; tp groups inside one host" "$work/two.log" ||
      { cat "$work/two.log"; fail "the 2-node run does not see 2 hosts with tp inside one"; }
    grep -q "^hosts: 1," "$work/one.log" || fail "the 1-node run does not see 1 host"
    echo "$recipe 2 nodes: $(checksums "$work/two.log")"
    echo "$recipe 1 node:  $(checksums "$work/one.log")"
    [ -n "$(checksums "$work/one.log")" ] &&
      [ "$(checksums "$work/two.log")" = "$(checksums "$work/one.log")" ] ||
      fail "$recipe: parameters on 2 nodes differ from 1 node"
  done
  ;;
tp-span)
  nsrun "$train" --dp 1 --tp 4 "${small[@]}" >"$work/span.log" 2>&1 ||
    { cat "$work/span.log"; fail "tp 4 run"; }
  grep -q "tp groups span hosts" "$work/span.log" || fail "no 'span hosts' topology line"
  grep -q "the tp axis 'tp' spans hosts" "$work/span.log" ||
    { cat "$work/span.log"; fail "no warning that tp spans hosts"; }
  echo "ok: $(grep "spans hosts" "$work/span.log" | head -n 1)"
  for world in mpi ucx; do
    QMESH_TEST_WORLD=$world nsrun "$build/tests/mpi/mpi_overlap_test" --gtest_color=no \
      >"$work/$world.log" 2>&1 || { cat "$work/$world.log"; fail "collective GEMMs across nodes on $world"; }
    echo "ok: collective GEMMs with tp across 2 nodes over $world: $(grep "PASSED" "$work/$world.log")"
  done
  ;;
bootstrap)
  nsrun "$build/tests/multinode/multinode_bootstrap_test" --gtest_color=no >"$work/boot.log" 2>&1 ||
    { cat "$work/boot.log"; fail "bootstrap exchanges across nodes"; }
  echo "ok: $(grep PASSED "$work/boot.log")"
  ;;
kill | link-down)
  # Ob1's TCP transport for MPI (the UCX PML reports a dead peer's closed connection as a
  # generic error before qmesh's timeout; the timeout is what is checked here).
  export QMESH_COMM_TIMEOUT_S=5 QMESH_MPI_TRANSPORT=tcp
  limit_ms=$((2 * QMESH_COMM_TIMEOUT_S * 1000))
  # kill: rank 1 on node 0 (link-down takes node 1's link), survivors on both nodes.
  if [ "$case_name" = kill ]; then victim=1 survivors="0 2 3"; else victim=-1 survivors="0 1 2 3"; fi
  for world in mpi ucx; do
    res=$work/$world
    mkdir -p "$res"
    # Each rank records its exit status and time (<res>/exit<r>) whatever mpirun reports;
    # --enable-recovery keeps Open MPI from killing the survivors when the victim dies.
    wrapper='"$0" "$1" "$2" all_reduce 100000; echo "$? $(date +%s%3N)" >"$1/exit$OMPI_COMM_WORLD_RANK"'
    QMESH_TEST_WORLD=$world timeout 60 "$nscluster" mpirun -d "$cluster" --ppn 2 \
      --enable-recovery sh -c "$wrapper" "$build/tests/mpi/mpi_kill_rank" "$res" "$victim" \
      >"$res/mpirun.log" 2>&1 &
    job=$!
    if [ "$case_name" = kill ]; then
      for _ in $(seq 300); do [ -f "$res/victim.txt" ] && break; sleep 0.1; done
      [ -f "$res/victim.txt" ] || { cat "$res/mpirun.log"; fail "$world: the victim did not die"; }
      fault_ms=$(awk '{print $2}' "$res/victim.txt")
    else
      for _ in $(seq 300); do [ -f "$res/started0" ] && [ -f "$res/started3" ] && break; sleep 0.1; done
      [ -f "$res/started3" ] || { cat "$res/mpirun.log"; fail "$world: the job did not start"; }
      sleep 1
      fault_ms=$(date +%s%3N)
      "$nscluster" exec -d "$cluster" 1 ip link set eth0 down
    fi
    for _ in $(seq $((limit_ms / 100 + 20))); do
      n=0
      for r in $survivors; do [ -f "$res/exit$r" ] && n=$((n + 1)); done
      [ "$n" -eq "$(echo $survivors | wc -w)" ] && break
      sleep 0.1
    done
    # Every rank has ended (or the check below fails); Open MPI's daemons may still wait on
    # each other: the job is ended here, the cluster at exit.
    kill "$job" 2>/dev/null
    wait "$job" 2>/dev/null
    [ "$case_name" = kill ] || "$nscluster" exec -d "$cluster" 1 ip link set eth0 up
    for r in $survivors; do
      [ -f "$res/rank$r.txt" ] || { cat "$res/mpirun.log"; fail "$world: rank $r left no result"; }
      read -r status _ message <"$res/rank$r.txt"
      [ "$status" = FAILED ] || fail "$world: rank $r: expected FAILED, got: $(cat "$res/rank$r.txt")"
      # qmesh's timeout, or UCX noticing the dead peer first (its endpoint timeout or a reset
      # connection): either names the operation and the ranks.
      case "$message" in
        *"timed out after"* | *"[Endpoint timeout]"* | *"[Connection reset by remote peer]"*) ;;
        *) fail "$world: rank $r: the message does not say what timed out or failed: $message" ;;
      esac
      [ -f "$res/exit$r" ] || fail "$world: rank $r had not exited ${limit_ms} ms after the fault"
      read -r code exited_ms <"$res/exit$r"
      [ "$code" -ne 0 ] || fail "$world: rank $r exited with status 0"
      elapsed=$((exited_ms - fault_ms))
      [ "$elapsed" -le "$limit_ms" ] ||
        fail "$world: rank $r exited ${elapsed} ms after the fault (limit ${limit_ms} ms)"
      echo "$world rank $r (node $((r / 2))): exit status $code, ${elapsed} ms after the fault: $message"
    done
  done
  ;;
*) fail "unknown case '$case_name'" ;;
esac
echo "multinode_test ($case_name): PASS"
