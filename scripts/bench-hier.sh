#!/usr/bin/env bash
# Flat against hierarchical collectives across namespace hosts (docs/benchmarks.md, "Hierarchical
# collectives"; scripts/netns-cluster.sh makes the hosts, tc tbf shapes every host's link):
#   scripts/bench-hier.sh [RATES [LAYOUTS [WHAT [OUT]]]]
#     RATES    comma list of link rates, default 100mbit,1gbit ("none": unshaped veth)
#     LAYOUTS  comma list of HOSTSxRANKS, default 2x2,3x2,2x1,1x2
#     WHAT     comma list of allreduce, resnet18, conns (default allreduce,resnet18)
#     OUT      folder of the CSV files and the summary (default build/bench-hier)
#   BENCH_BATCH=N  ResNet-18's batch per rank (default 32; smaller makes the all-reduce a larger share)
# allreduce: allreduce_bench --algorithm flat,hierarchical (auto on 2x1 and 1x2, where it means flat):
# each size measured with both algorithms in turn in one job, side by side under the same load.
# resnet18: ddp_bench --model resnet18 --mode ddp, alternately flat and hierarchical (auto), 2 runs each.
# conns: unshaped, 2 hosts x 1 rank, GLOO_SOCKET_IFNAME=eth0 / eth0,eth0 / eth0,eth0,eth0,eth0 (1, 2 and
# 4 Gloo devices: connections per pair). Needs root (network namespaces); every job is bounded by
# timeout; the bed and its processes are removed on exit. Figures only, never pass/fail.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

rates=${1:-100mbit,1gbit}
layouts=${2:-2x2,3x2,2x1,1x2}
what=${3:-allreduce,resnet18}
out=${4:-$DDP_BUILD_DIR/bench-hier}
cluster=$DDP_ROOT/scripts/netns-cluster.sh
bin=$DDP_BUILD_DIR/bin
reason=$("$cluster" check) || { echo "bench-hier.sh: $reason" >&2; exit 2; }
for b in ddp_launch allreduce_bench ddp_bench; do
  [[ -x $bin/$b ]] || { echo "bench-hier.sh: $bin/$b is missing: DDP_BUILD_TARGETS=\"ddp_launch allreduce_bench ddp_bench\" scripts/build.sh" >&2; exit 2; }
done
mkdir -p "$out"
name="bhier$$"
up=""
cleanup() { [[ -z $up ]] || "$cluster" down "$name"; }
trap cleanup EXIT
trap 'exit 143' INT TERM
export OMP_NUM_THREADS=1
port=29611

# job HOSTS RANKS LOG PROGRAM ARGS...: one ddp_launch per host, bounded; host 0's output in LOG.
job() {
  local hosts=$1 ranks=$2 log=$3 k pids=() status=0
  shift 3
  port=$((port + 1))
  local host0
  host0=$("$cluster" addr "$name" 0)
  for ((k = 0; k < hosts; k++)); do
    "$cluster" exec "$name" "$k" env ${GLOO_SOCKET_IFNAME:+GLOO_SOCKET_IFNAME=$GLOO_SOCKET_IFNAME} \
      timeout -s KILL 900 "$bin/ddp_launch" --nproc_per_node "$ranks" --nnodes "$hosts" --node_rank "$k" \
      --master_addr "$host0" --master_port "$port" "$@" >"$log.host$k" 2>&1 &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || status=1; done
  cat "$log.host0" >>"$log"
  ((status == 0)) || echo "bench-hier.sh: a job failed, see $log.host*" >&2
}

bed() {  # bed HOSTS RATE: a fresh bed of HOSTS hosts with links shaped to RATE
  [[ -z $up ]] || "$cluster" down "$name"
  if [[ $2 == none ]]; then "$cluster" up "$name" "$1"; else "$cluster" up "$name" "$1" --rate "$2"; fi
  up=1
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores; $(date -u +%FT%TZ)" | tee -a "$out/summary.txt"
IFS=, read -ra rate_list <<<"$rates"
IFS=, read -ra layout_list <<<"$layouts"
for rate in "${rate_list[@]}"; do
  for layout in "${layout_list[@]}"; do
    hosts=${layout%x*} ranks=${layout#*x}
    algorithms=flat,hierarchical
    ((hosts > 1 && ranks > 1)) || algorithms=flat,auto
    bed "$hosts" "$rate"
    if [[ ,$what, == *,allreduce,* ]]; then
      csv=$out/allreduce-$rate-$layout.csv
      rm -f "$csv"
      job "$hosts" "$ranks" "$out/allreduce-$rate-$layout.log" "$bin/allreduce_bench" --algorithm "$algorithms" \
        --min-bytes 1048576 --max-bytes 16777216 --warmup 1 --iters 3 --csv "$csv"
    fi
    if [[ ,$what, == *,resnet18,* ]]; then
      csv=$out/resnet18-$rate-$layout.csv
      rm -f "$csv"
      for round in 1 2; do
        for algorithm in ${algorithms//,/ }; do
          job "$hosts" "$ranks" "$out/resnet18-$rate-$layout.log" "$bin/ddp_bench" --model resnet18 --mode ddp \
            --batch "${BENCH_BATCH:-32}" --warmup 1 --iters 3 --algorithm "$algorithm" --csv "$csv" --append
        done
      done
    fi
  done
done
if [[ ,$what, == *,conns,* ]]; then
  bed 2 none
  for ifname in eth0 eth0,eth0 eth0,eth0,eth0,eth0; do
    GLOO_SOCKET_IFNAME=$ifname job 2 1 "$out/conns-$ifname.log" "$bin/allreduce_bench" --algorithm flat \
      --min-bytes 16777216 --max-bytes 67108864 --warmup 1 --iters 5 --csv "$out/conns-$ifname.csv"
    GLOO_SOCKET_IFNAME=$ifname job 2 1 "$out/conns-$ifname.log" "$bin/ddp_bench" --model resnet18 --mode ddp \
      --batch 32 --warmup 1 --iters 3 --csv "$out/conns-$ifname.csv.train"
  done
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)" | tee -a "$out/summary.txt"
