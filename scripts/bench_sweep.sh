#!/usr/bin/env bash
# Sweep of build/bin/ddp_bench into one CSV: for each model and batch, single, dp and ddp at world
# size 1 (one process), then ddp under ddp_launch at each larger world size with --baseline set to the
# single figure, so every row has its scaling efficiency. ROUNDS > 1 repeats the whole sweep (the
# plot takes medians). Then scripts/plot_bench.sh draws the charts.
#   scripts/bench_sweep.sh [OUT_DIR] ; environment: MODELS="lenet resnet18" BATCHES="64" WORLD_SIZES="2"
#   ITERS=20 WARMUP=5 ROUNDS=1 THREADS=1 (intra-op threads per process)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${DDP_BUILD_DIR:-$root/build}/bin
out=${1:-$root/build/bench}
models=${MODELS:-lenet resnet18} batches=${BATCHES:-64} world_sizes=${WORLD_SIZES:-2}
iters=${ITERS:-20} warmup=${WARMUP:-5} rounds=${ROUNDS:-1}
export OMP_NUM_THREADS=${THREADS:-1}
for tool in ddp_bench ddp_launch; do [[ -x $bin/$tool ]] || { echo "bench_sweep: no $bin/$tool: build it first" >&2; exit 2; }; done
mkdir -p "$out"
csv=$out/results.csv
rm -f "$csv"
common=(--warmup "$warmup" --iters "$iters" --no-markdown --csv "$csv" --append)
last_single() { awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } $c["mode"] == "single" { s = $c["samples_per_s"] } END { print s }' "$csv"; }
for ((round = 1; round <= rounds; round++)); do
  for model in $models; do
    for batch in $batches; do
      echo "bench_sweep: round $round, $model batch $batch: single, dp, ddp at world size 1" >&2
      "$bin/ddp_bench" --model "$model" --batch "$batch" --mode single,dp,ddp "${common[@]}"
      base=$(last_single)
      for ws in $world_sizes; do
        echo "bench_sweep: round $round, $model batch $batch: ddp at world size $ws" >&2
        "$bin/ddp_launch" --nproc_per_node "$ws" --master_port 0 "$bin/ddp_bench" --model "$model" --batch "$batch" \
          --mode ddp --baseline "$base" "${common[@]}"
      done
    done
  done
done
echo "bench_sweep: wrote $csv" >&2
column -s, -t < "$csv" | cut -c1-220
