#!/usr/bin/env bash
# Samples/s of this library's DDP (build/bin/ddp_micro_bench throughput) against PyTorch's Python DDP
# (ddp_torch_reference.py under the venv's torchrun): same model, data, batch, ranks and threads.
# Runs alternate (C++ first in odd rounds, Python first in even ones) and the medians are printed,
# because a shared machine is noisy.
#   benchmarks/ddp_compare.sh MODEL BATCH ITERS [ROUNDS] [NPROC]
# e.g. benchmarks/ddp_compare.sh lenet 64 200 5 2
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model=$1 batch=$2 iters=$3 rounds=${4:-5} nproc=${5:-2}
build=${DDP_BUILD_DIR:-$root/build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Both sides start under the same launcher (the venv's torchrun; --no-python for the C++ binary):
# torchrun puts each worker in a session of its own, and with the kernel's autogroup scheduling a
# session's share of a busy machine does not depend on its thread count, so launchers that differ in
# that would compare scheduling rather than DDP. DDP_COMPARE_LAUNCHER=ddp_launch uses ddp_launch for C++.
if [[ ${DDP_COMPARE_LAUNCHER:-torchrun} == ddp_launch ]]; then
  launch=("$build/bin/ddp_launch" --nproc_per_node "$nproc" --master_port 0)
else
  launch=("$root/.venv/bin/torchrun" --no-python --nproc_per_node "$nproc")
fi
args=(--model "$model" --batch "$batch" --iters "$iters" --warmup 3)
cpp=() py=()
run_cpp() { "${launch[@]}" "$build/bin/ddp_micro_bench" throughput "${args[@]}" 2>&1 | grep -o '[0-9.]* samples/s' | cut -d' ' -f1; }
run_py() {
  "$root/.venv/bin/torchrun" --nproc_per_node "$nproc" "$root/benchmarks/ddp_torch_reference.py" "${args[@]}" 2>&1 |
    grep -o '[0-9.]* samples/s' | cut -d' ' -f1
}
for ((round = 1; round <= rounds; round++)); do
  if ((round % 2)); then c=$(run_cpp); p=$(run_py); else p=$(run_py); c=$(run_cpp); fi
  cpp+=("$c") py+=("$p")
  echo "round $round: ddp-cpp $c samples/s, torch-python-ddp $p samples/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
mc=$(median "${cpp[@]}") mp=$(median "${py[@]}")
echo "median $model batch/rank=$batch world=$nproc threads=$OMP_NUM_THREADS: ddp-cpp $mc samples/s, torch-python-ddp $mp samples/s, ratio $(awk -v a="$mc" -v b="$mp" 'BEGIN {printf "%.2f", a / b}')x"
