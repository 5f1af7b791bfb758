#!/usr/bin/env bash
# Issue 15's figures in one run (docs/benchmarks.md: "DataParallel vs DDP on the CPU", "ZeRO"):
#   1. single, DataParallel over 2 CPU replicas and DDP over 2 ranks, LeNet and ResNet-18, into one CSV;
#   2. Adam on ResNet-18 with and without --zero at world sizes 1, 2, 4: optimizer state per rank, step time.
# usage: [PARTS="dp zero"] scripts/bench_training_features.sh [OUT_DIR]   (default build/bench_training_features)
# Every process, replica and rank runs 1 intra-op thread (--threads 1): DP's 2 replicas and DDP's 2 ranks
# then use the same 2 cores, and no OpenMP team spins against another job's on a shared machine.
# Prints the load average before and after: the machine is shared, timings move with it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out=${1:-$DDP_BUILD_DIR/bench_training_features}
mkdir -p "$out"
bench=$DDP_BUILD_DIR/bin/ddp_bench
launch=$DDP_BUILD_DIR/bin/ddp_launch
iters=(--warmup 2 --iters 6)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"

parts=${PARTS:-dp zero}
dp_csv=$out/dp_vs_ddp.csv
[[ $parts == *dp* ]] && rm -f "$dp_csv"
[[ $parts == *dp* ]] && for model in lenet resnet18; do
  batch=64; [[ $model == resnet18 ]] && batch=32
  # single and dp: one process with every core; ddp: 2 ranks with half the cores each, the same
  # per-rank batch as dp's per-replica batch (dp and single split a global batch of 2 x batch).
  "$bench" --model $model --mode single,dp --dp-replicas 2 --threads 1 --batch $((2 * batch)) "${iters[@]}" --csv "$dp_csv" --append --no-markdown
  "$launch" --nproc_per_node 2 --master_port 0 "$bench" --model $model --mode ddp --batch $batch "${iters[@]}" \
    --csv "$dp_csv" --append --no-markdown
done

zero_csv=$out/zero.csv
[[ $parts == *zero* ]] && rm -f "$zero_csv"
[[ $parts == *zero* ]] && for world in 1 2 4; do
  for zero in "" --zero; do
    "$launch" --nproc_per_node $world --master_port 0 "$bench" --model resnet18 --mode ddp --batch 8 --optimizer adam \
      $zero --warmup 1 --iters 3 --csv "$zero_csv" --append --no-markdown
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "wrote $dp_csv $zero_csv"
