#!/usr/bin/env bash
# run_gpu_test.sh MIN_GPUS WORKER COMMAND...: runs COMMAND when this machine has a CUDA build of the
# ddp library and at least MIN_GPUS visible GPUs; otherwise prints why and exits 77, which CTest
# reports as skipped (SKIP_RETURN_CODE). WORKER is gpu_test_worker (its `count` subcommand answers).
set -uo pipefail
min=$1 worker=$2
shift 2
read -r count has_cuda < <("$worker" count) || { echo "run_gpu_test: '$worker count' failed" >&2; exit 1; }
if [[ $has_cuda != 1 ]]; then
  echo "SKIPPED: this build uses a LibTorch without CUDA (build with scripts/build-cuda.sh or scripts/gpu-check.sh)"
  exit 77
fi
if ((count < min)); then
  echo "SKIPPED: needs $min GPU(s), this process sees $count (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset})"
  exit 77
fi
exec "$@"
