#!/usr/bin/env bash
# Side by side, in one run, on this machine, alternating A and B (A first in odd rounds, B first in
# even ones) and taking medians:
#   1. this library's DDP (build/bin/ddp_bench --mode ddp under ddp_launch) against PyTorch's Python DDP
#      (benchmarks/torch_ddp_reference.py under the venv's torchrun): the same models (the examples'),
#      synthetic data, per-rank batch, ranks, threads, iterations, Gloo on the CPU; for the small CNN
#      (lenet, batch 64) and ResNet-18;
#   2. ddp_launch against torchrun, start-to-exit of 8 workers (build/bin/launch_startup_bench);
#   3. DP against DDP on GPUs: only where CUDA devices are present.
# Prints every round and the ratios.
#   scripts/bench-vs-pytorch.sh ; environment: ROUNDS=3 NPROC=2 THREADS=1 LENET_BATCH=64 LENET_ITERS=60
#   RESNET_BATCH=16 RESNET_ITERS=4 WARMUP=3 STARTUP_REPS=5
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${DDP_BUILD_DIR:-$root/build}/bin
rounds=${ROUNDS:-3} nproc=${NPROC:-2} warmup=${WARMUP:-3}
export OMP_NUM_THREADS=${THREADS:-1}
for tool in ddp_bench ddp_launch launch_startup_bench; do
  [[ -x $bin/$tool ]] || { echo "bench-vs-pytorch: no $bin/$tool: cmake --build build --target $tool" >&2; exit 2; }
done
[[ -x $root/.venv/bin/torchrun ]] || { echo "bench-vs-pytorch: no .venv/bin/torchrun: run scripts/setup.sh" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

cpp_ddp() {  # model batch iters -> samples/s
  rm -f "$work/cpp.csv"
  "$bin/ddp_launch" --nproc_per_node "$nproc" --master_port 0 "$bin/ddp_bench" --mode ddp --model "$1" --batch "$2" \
    --iters "$3" --warmup "$warmup" --no-markdown --csv "$work/cpp.csv" > "$work/cpp.log" 2>&1 ||
    { cat "$work/cpp.log" >&2; return 1; }
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { print $c["samples_per_s"] }' "$work/cpp.csv"
}
py_ddp() {
  "$root/.venv/bin/torchrun" --standalone --nproc_per_node "$nproc" "$root/benchmarks/torch_ddp_reference.py" \
    --model "$1" --batch "$2" --iters "$3" --warmup "$warmup" > "$work/py.log" 2>&1 || true
  # The figure counts once printed (a rank that aborts in Gloo's teardown afterwards does not change it).
  grep -o 'samples_per_s=[0-9.]*' "$work/py.log" | cut -d= -f2 | grep . || { cat "$work/py.log" >&2; return 1; }
}

summary=()
compare() {  # model batch iters
  local model=$1 batch=$2 iters=$3 c p cs=() ps=()
  for ((round = 1; round <= rounds; round++)); do
    if ((round % 2)); then c=$(cpp_ddp "$@"); p=$(py_ddp "$@"); else p=$(py_ddp "$@"); c=$(cpp_ddp "$@"); fi
    cs+=("$c") ps+=("$p")
    echo "  round $round: ddp (C++) $c samples/s, torch DDP (Python) $p samples/s"
  done
  local mc mp
  mc=$(median "${cs[@]}") mp=$(median "${ps[@]}")
  summary+=("$(printf '%-9s batch/rank %3s, %s ranks, %s thread(s)/rank: C++ DDP %8.1f samples/s, Python DDP %8.1f samples/s, ratio %sx' \
    "$model" "$batch" "$nproc" "$OMP_NUM_THREADS" "$mc" "$mp" "$(ratio "$mc" "$mp")")")
  echo "${summary[-1]}"
}

echo "== machine: $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%F %T') UTC"
echo "== 1. C++ DDP vs Python DDP (Gloo, CPU, synthetic data, medians of $rounds alternated rounds)"
compare lenet "${LENET_BATCH:-64}" "${LENET_ITERS:-60}"
compare resnet18 "${RESNET_BATCH:-16}" "${RESNET_ITERS:-4}"

echo "== 2. ddp_launch vs torchrun, start-to-exit of 8 workers"
"$bin/launch_startup_bench" --reps "${STARTUP_REPS:-5}" --nproc 8 --torchrun "$root/.venv/bin/torchrun" | tee "$work/startup.log"
summary+=("launch, 8 workers: $(grep "^median" "$work/startup.log"); $(grep "^ratio" "$work/startup.log")")

echo "== 3. DP vs DDP on GPUs"
gpus=$("$root/.venv/bin/python" -c 'import torch; print(torch.cuda.device_count())' 2> /dev/null || echo 0)
if ((gpus >= 2)); then
  rm -f "$work/dp.csv"
  "$bin/ddp_bench" --mode dp --model lenet --batch $((64 * gpus)) --no-markdown --csv "$work/dp.csv"
  "$bin/ddp_launch" --nproc_per_node "$gpus" --master_port 0 "$bin/ddp_bench" --mode ddp --model lenet --batch 64 \
    --no-markdown --csv "$work/dp.csv" --append
  read -r dp ddp < <(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { v[NR] = $c["samples_per_s"] } END { print v[2], v[3] }' "$work/dp.csv")
  summary+=("DP vs DDP, lenet, $gpus GPUs, 64 per GPU: DP $dp samples/s, DDP $ddp samples/s, DDP/DP $(ratio "$ddp" "$dp")x")
else
  summary+=("DP vs DDP: skipped: $gpus CUDA device(s) here (this LibTorch is the CPU build, or the machine has no GPU); DP on one CPU device is plain training")
fi
echo "== summary"
printf '%s\n' "${summary[@]}"
