#!/usr/bin/env bash
# Issue 13's accuracy target for a membership change, measured (not a CI test: a few minutes on 2 cores):
# LeNet on Fashion-MNIST, EPOCHS epochs (default 3) on one host,
#   (1) at world size 3, undisturbed;
#   (2) at world size 3, stopped in the middle of epoch 2 (a checkpoint there), resumed with --resume
#       at world size 2, which re-shards the rest of the epoch (See Note [Re-sharding at a new world size]).
# Prints both final test accuracies; fails when they differ by more than 1 point.
# usage: scripts/elastic_fashion_mnist.sh [global|per-rank] [EPOCHS] [DATA_DIR]
#   global (default): 96 samples per step at both sizes (--batch-policy global --global-batch-size 96);
#   per-rank: --batch-size 32 per rank, so 96 then 64 per step.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
policy=${1:-global}
epochs=${2:-3}
data=${3:-/usr/share/datasets/fashion-mnist}
case $policy in
  global) batch=(--batch-policy global --global-batch-size 96) ;;
  per-rank) batch=(--batch-size 32) ;;
  *) echo "usage: $0 [global|per-rank] [EPOCHS] [DATA_DIR]" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launch() {  # launch NPROC LOG ARGS...
  local nproc=$1 log=$2
  shift 2
  "$DDP_BUILD_DIR/bin/ddp_launch" --nproc_per_node "$nproc" --master_port 0 "$DDP_BUILD_DIR/bin/train_fashion_mnist" \
    --mode ddp --epochs "$epochs" --data-dir "$data" "${batch[@]}" "$@" | tee -a "$log"
}
accuracy() { sed -n 's/.*final test accuracy \([0-9.]*\)%.*/\1/p' "$1" | tail -1; }

# 60000 samples, 20000 per rank at world size 3, 32 per rank and step: 625 steps per epoch.
stop=$((625 + 625 / 2))
echo "== world size 3, undisturbed"
launch 3 "$work/whole.log"
echo "== world size 3, stopped at step $stop (the middle of epoch 2), resumed at world size 2"
launch 3 "$work/elastic.log" --checkpoint-dir "$work/ck" --checkpoint-every "$stop" --max-steps "$stop"
launch 2 "$work/elastic.log" --checkpoint-dir "$work/ck" --resume
whole=$(accuracy "$work/whole.log")
elastic=$(accuracy "$work/elastic.log")
[[ -n $whole && -n $elastic ]] || { echo "elastic_fashion_mnist: no final accuracy in the output" >&2; exit 1; }
grep -h "world size 3 -> 2" "$work/elastic.log" || true
echo "elastic_fashion_mnist: --batch-policy $policy, $epochs epochs: world size 3 undisturbed $whole%," \
  "3 -> 2 in epoch 2 $elastic%"
awk -v a="$whole" -v b="$elastic" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1) }' ||
  { echo "elastic_fashion_mnist: the accuracies differ by more than 1 point" >&2; exit 1; }
