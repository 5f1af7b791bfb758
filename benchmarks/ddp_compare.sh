#!/usr/bin/env bash
# Samples/s of this library's DDP against PyTorch's Python DDP for one model: a shortcut for
# scripts/bench-vs-pytorch.sh (ddp_bench --mode ddp under ddp_launch against
# benchmarks/torch_ddp_reference.py under torchrun; same model, data, batch, ranks and threads; rounds
# alternate, medians and the ratio are printed).
#   benchmarks/ddp_compare.sh MODEL BATCH ITERS [ROUNDS] [NPROC] [--data synthetic|fashion-mnist]
# e.g. benchmarks/ddp_compare.sh lenet 64 200 5 2
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
(($# >= 3)) || { echo "usage: benchmarks/ddp_compare.sh MODEL BATCH ITERS [ROUNDS] [NPROC] [--data synthetic|fashion-mnist]" >&2; exit 2; }
model=$1 batch=$2 iters=$3
shift 3
rounds=5 nproc=2
[[ ${1:-} =~ ^[0-9]+$ ]] && { rounds=$1; shift; }
[[ ${1:-} =~ ^[0-9]+$ ]] && { nproc=$1; shift; }
case $model in
  lenet) export LENET_BATCH=$batch LENET_ITERS=$iters ;;
  resnet18) export RESNET_BATCH=$batch RESNET_ITERS=$iters ;;
  *) echo "ddp_compare: MODEL must be lenet or resnet18, not '$model'" >&2; exit 2 ;;
esac
ROUNDS=$rounds NPROC=$nproc MODELS=$model SKIP_LAUNCH=1 THREADS=${OMP_NUM_THREADS:-1} \
  exec "$root/scripts/bench-vs-pytorch.sh" "$@"
