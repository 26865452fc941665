#!/usr/bin/env bash
# Launch through a real Slurm: starts munged, slurmctld and one slurmd per node of a two-node
# nscluster (Debian's packages, a generated slurm.conf, every path under a temporary
# directory), submits launch/slurm/train_mlp.sbatch (2 nodes x 2 tasks, dp 2 x tp 2) with
# sbatch, waits for the job, checks that it saw two hosts with tp inside one and trained to
# bitwise the parameters of the same job under mpirun on one node, then stops every daemon.
# Exits 77 (skipped) with the reason where nscluster cannot run or Slurm is not installed.
# Usage: slurm_test.sh <build dir>
set -uo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
nscluster=$src/launch/cluster/nscluster
fail() { echo "FAIL: $*"; [ -n "${work:-}" ] && tail -n 20 "$work"/*.log 2>/dev/null; exit 1; }

reason=$("$nscluster" check) || { echo "SKIP: $reason"; exit 77; }
for t in munged mungekey slurmctld slurmd sbatch squeue scontrol; do
  command -v $t >/dev/null ||
    { echo "SKIP: no $t (apt-get install slurmctld slurmd slurm-client munge, or launch/install_deps.sh --multinode)"; exit 77; }
done
work=$(mktemp -d /tmp/qmesh-slurm.XXXXXX)
chmod 755 "$work"  # munged wants world-executable parents for its socket
cluster=$work/cluster
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done  # slurmds, slurmctld, munged
  "$nscluster" down -d "$cluster"
  rm -rf "$work"
}
trap cleanup EXIT
"$nscluster" up -d "$cluster" -n 2 || fail "could not create the cluster"
addr() { awk -v n=$(($1 + 1)) 'NR==n{print $3}' "$cluster/nodes"; }

# munge: a fresh key and a daemon with its socket under $work.
mkdir -p "$work/munge"
mungekey -c -k "$work/munge/munge.key" || fail "mungekey"
munged -F --force -S "$work/munge/socket" --key-file "$work/munge/munge.key" \
  --pid-file "$work/munge/munged.pid" --log-file "$work/munged.log" \
  --seed-file "$work/munge/seed" >/dev/null 2>&1 &
pids+=($!)

mkdir -p "$work/state" "$work/spool/qmesh-node0" "$work/spool/qmesh-node1" \
  "$work/tmp/qmesh-node0" "$work/tmp/qmesh-node1"
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=qmeshtest
SlurmctldHost=qmesh-node0($(addr 0))
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.%n.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.%n.log
TmpFS=$work/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=pmix
ReturnToService=2
NodeName=qmesh-node0 NodeAddr=$(addr 0) CPUs=2 State=UNKNOWN
NodeName=qmesh-node1 NodeAddr=$(addr 1) CPUs=2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
for _ in $(seq 50); do [ -S "$work/munge/socket" ] && break; sleep 0.1; done
[ -S "$work/munge/socket" ] || fail "munged did not start"

"$nscluster" exec -d "$cluster" 0 slurmctld -D -f "$SLURM_CONF" >/dev/null 2>&1 &
pids+=($!)
for i in 0 1; do
  "$nscluster" exec -d "$cluster" $i slurmd -D -f "$SLURM_CONF" -N qmesh-node$i >/dev/null 2>&1 &
  pids+=($!)
done
on0() { "$nscluster" exec -d "$cluster" 0 "$@"; }
for _ in $(seq 150); do
  [ "$(on0 sinfo -h -o %T 2>/dev/null | sort -u)" = idle ] && break
  sleep 0.2
done
[ "$(on0 sinfo -h -o %T 2>/dev/null | sort -u)" = idle ] || { on0 sinfo; fail "the nodes did not come up"; }
echo "slurm: $(on0 sinfo -h -o '%D nodes %T %N')"

# The job: dp across the nodes, tp inside each.
args=(--dp 2 --tp 2 --layers 1 --hidden 64 --ffn 256 --seq 32 --batch 4 --steps 10 --log-every 1000)
cd "$work"
job=$(QMESH_TRAIN_MLP=$build/examples/train_mlp/train_mlp QMESH_COMM_TIMEOUT_S=30 \
  on0 sbatch --parsable --output="$work/job-%j.out" "$src/launch/slurm/train_mlp.sbatch" "${args[@]}") ||
  fail "sbatch"
state=""
for _ in $(seq 600); do  # at most 120 s (sbatch --wait polls slowly)
  state=$(on0 scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
  sleep 0.2
done
out=$work/job-$job.out
cat "$out"
[ "$state" = COMPLETED ] || fail "job $job ended $state"
grep -q "on qmesh-node\[0-1\], 4 tasks" "$out" || fail "the job did not run on both nodes"
grep -q "^hosts: 2, at most 2 ranks each; tp groups inside one host" "$out" ||
  fail "the job did not see 2 hosts with tp inside one"
timeout 120 "$src/launch/qmeshrun" -np 4 "$build/examples/train_mlp/train_mlp" "${args[@]}" \
  >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "1-node run"; }
a=$(grep "^parameter checksums" "$out")
b=$(grep "^parameter checksums" "$work/one.log")
echo "slurm, 2 nodes: $a"
echo "mpirun, 1 node: $b"
[ -n "$b" ] && [ "$a" = "$b" ] || fail "parameters under Slurm differ from the 1-node run"
echo "slurm_test: PASS"
