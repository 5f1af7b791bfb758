#!/usr/bin/env bash
# Multi-process checkpoint test: test_checkpoint_ranks.sh DDP_LAUNCH WORKER SCRATCH_DIR
# Real ranks over Gloo on 127.0.0.1, started by ddp_launch; see test_checkpoint_worker.cpp.
set -euo pipefail
launch=$1
worker=$2
scratch=$3
rm -rf "$scratch"
mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT

ranks() {  # ranks NPROC ARGS...: one launch, bounded in time
  local nproc=$1
  shift
  echo "== $nproc ranks: $*"
  timeout --kill-after 5 60 "$launch" --master_port 0 --nproc_per_node "$nproc" "$worker" "$@"
}

ranks 2 run "$scratch/ckpt" 16 7            # checkpoints at steps 7 and 9, final.pt after 16
ranks 2 resume "$scratch/ckpt" 16 9         # from step 9: ends exactly at final.pt
head -c 100 "$scratch/ckpt/step-000000000009/model.pt" > "$scratch/cut"
mv "$scratch/cut" "$scratch/ckpt/step-000000000009/model.pt"
ranks 2 resume "$scratch/ckpt" 16 7         # newest is truncated: from step 7, same end
ranks 3 resume "$scratch/ckpt" 16 7         # another world size: the sampler position converts
ranks 2 fail "$scratch/fail"                # rank 0 cannot write: all ranks fail clearly
echo "checkpoint ranks test passed"
