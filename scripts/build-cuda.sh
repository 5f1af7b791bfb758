#!/usr/bin/env bash
# Compiles and links the CUDA/NCCL code paths against a CUDA LibTorch, so that the NCCL and CUDA code paths
# (USE_C10D_NCCL, DDP_WITH_CUDA; see Note [CUDA LibTorch builds] in cmake/DdpCuda.cmake) cannot rot on a
# machine without a GPU. Runs nothing. The torch 2.14.1 CUDA 13 wheel's layer of scripts/common.sh:
# .venv-2.14.1 (set-up creates it when missing) and build-2.14.1/, the folder that
# `DDP_TORCH_VERSION=2.14.1 scripts/test.sh` builds and tests, so that the two share one build.
# Builds the targets with CUDA or NCCL code paths (DDP_CUDA_TARGETS=all: every target).
#   CUDA_HOME / CUDAToolkit_ROOT   the CUDA toolkit with nvcc (default: /usr/local/cuda, or nvcc's)
#   DDP_CUDA_OPTIONAL=1            without a CUDA toolkit, say so and exit 0 instead of failing
#   extra arguments go to the CMake configure step (scripts/build.sh)
set -euo pipefail
export DDP_TORCH_VERSION=2.14.1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ -n ${DDP_CUDA_OPTIONAL:-} && -z $(ddp_cuda_root) ]]; then
  echo "build-cuda: SKIPPED: no CUDA toolkit (nvcc) on this machine, so the CUDA build cannot be configured"
  exit 0
fi
"$DDP_ROOT/scripts/setup.sh"
# The targets with CUDA or NCCL code paths (DDP_WITH_CUDA / USE_C10D_NCCL in the library, the CUDA
# branch of the examples' train_common, ddp_bench's and gpu_bench's CUDA modes, the GPU tests).
targets="ddp ddp_examples ddp_bench gpu_bench test_gpu_units gpu_test_worker sync_bn_worker"
[[ ${DDP_CUDA_TARGETS:-} == all ]] && targets=all
DDP_BUILD_TARGETS=$targets "$DDP_ROOT/scripts/build.sh" "$@"
grep -q USE_C10D_NCCL "$DDP_BUILD_DIR/build.ninja" 2>/dev/null ||
  ddp_die "$DDP_BUILD_DIR was configured without CUDA: LibTorch's CMake config did not find CUDA"
echo "build-cuda: built against torch $DDP_TORCH_VERSION with CUDA in $DDP_BUILD_DIR"
