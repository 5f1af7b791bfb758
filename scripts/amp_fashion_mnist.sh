#!/usr/bin/env bash
# Issue 15's accuracy target for mixed precision, measured (not a CI test: about 2 minutes on 2 cores):
# LeNet on Fashion-MNIST, 2 DDP ranks, 5 epochs, autocast in --amp (default bf16); fails unless the
# final test accuracy is at least 89%.
# usage: scripts/amp_fashion_mnist.sh [bf16|fp16] [DATA_DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
amp=${1:-bf16}
data=${2:-/usr/share/datasets/fashion-mnist}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$DDP_BUILD_DIR/bin/ddp_launch" --nproc_per_node 2 --master_port 0 "$DDP_BUILD_DIR/bin/train_fashion_mnist" \
  --mode ddp --amp "$amp" --epochs 5 --data-dir "$data" | tee "$log"
accuracy=$(sed -n 's/.*final test accuracy \([0-9.]*\)%.*/\1/p' "$log" | tail -1)
[[ -n $accuracy ]] || { echo "amp_fashion_mnist: no final accuracy in the output" >&2; exit 1; }
awk -v a="$accuracy" 'BEGIN { exit !(a >= 89) }' || { echo "amp_fashion_mnist: $accuracy% < 89%" >&2; exit 1; }
echo "amp_fashion_mnist: --amp $amp, 2 ranks, 5 epochs: $accuracy% >= 89%"
