#!/usr/bin/env bash
# The hierarchical collectives on real hosts (network namespaces, scripts/netns-cluster.sh,
# docs/hosts.md): 2 hosts x 2 ranks under ddp_launch; each rank learns the topology by the exchange
# of host identities and checks that its hierarchical all-reduce, broadcast and all-gather equal the
# flat ones (tests/ddp/hier_worker.cpp).
#   hier_test.sh NETNS_CLUSTER DDP_LAUNCH HIER_WORKER
# Exits 77 (CTest skip) without the rights to make namespaces. Every launcher is bounded by
# timeout; the hosts and every process in them go away on exit.
set -euo pipefail

cluster=$1 launch=$2 worker=$3
reason=$("$cluster" check) || {
  echo "SKIP: $reason"
  exit 77
}
name="hier$$"
work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  "$cluster" down "$name"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM
"$cluster" up "$name" 2
master=$("$cluster" addr "$name" 0)
for k in 0 1; do
  "$cluster" exec "$name" "$k" timeout -s KILL 60 "$launch" --nproc_per_node 2 --nnodes 2 --node_rank "$k" \
    --master_addr "$master" --master_port 29555 --log_dir "$work/logs$k" "$worker" >"$work/host$k.log" 2>&1 &
  pids+=($!)
done
status=0
for k in 0 1; do wait "${pids[$k]}" || status=1; done
pids=()
found=$(cat "$work"/host*.log | grep -c "hier ok rank" || true)
if ((status != 0 || found != 4)); then
  echo "FAIL: launchers' status $status, $found of 4 ranks reported 'hier ok'"
  for k in 0 1; do echo "---- host $k"; tail -n 40 "$work/host$k.log"; done
  exit 1
fi
grep -h "hier ok rank 0" "$work"/host*.log
echo "PASS: 2 hosts x 2 ranks, hierarchical collectives equal the flat ones"
