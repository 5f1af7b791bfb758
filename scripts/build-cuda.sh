#!/usr/bin/env bash
# Compiles and links the CUDA/NCCL code paths against a CUDA LibTorch, so that the NCCL and CUDA code paths
# (USE_C10D_NCCL, DDP_WITH_CUDA; see Note [CUDA LibTorch builds] in cmake/DdpCuda.cmake) cannot rot on a
# machine without a GPU. Runs nothing. Creates $DDP_ROOT/.venv-cuda with torch==2.14.1 (CUDA 13, its
# nvidia-* wheels) when missing, configures build-cuda/ (or $DDP_CUDA_BUILD_DIR) and builds the ddp
# library, the examples, the benchmarks and the GPU tests (DDP_CUDA_TARGETS=all: every target).
#   CUDA_HOME / CUDAToolkit_ROOT   the CUDA toolkit with nvcc (default: /usr/local/cuda, or nvcc's)
#   DDP_JOBS=N                     parallel compile jobs (default: number of cores)
#   DDP_CUDA_OPTIONAL=1            without a CUDA toolkit, say so and exit 0 instead of failing (CI)
#   extra arguments go to the CMake configure step
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

venv="$DDP_ROOT/.venv-cuda"
build_dir=${DDP_CUDA_BUILD_DIR:-$DDP_ROOT/build-cuda}
torch_version=2.14.1

if ! "$venv/bin/python" -c "import torch, sys; sys.exit(not (torch.__version__.split('+')[0] == '$torch_version' and torch.version.cuda))" 2>/dev/null; then
  echo "build-cuda: creating $venv with torch==$torch_version (CUDA)"
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$torch_version" ||
    ddp_die "could not install torch==$torch_version with CUDA into $venv (pip must find the CUDA wheel and its nvidia-* wheels)"
fi
prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null) ||
  ddp_die "$venv/bin/python cannot import torch"

cuda_root=${CUDAToolkit_ROOT:-${CUDA_HOME:-}}
if [[ -z $cuda_root ]]; then
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    cuda_root=/usr/local/cuda
  elif command -v nvcc >/dev/null; then
    cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  elif [[ -n ${DDP_CUDA_OPTIONAL:-} ]]; then
    echo "build-cuda: SKIPPED: no CUDA toolkit (nvcc) on this machine, so the CUDA build cannot be configured"
    exit 0
  else
    ddp_die "no CUDA toolkit: LibTorch's CMake config needs nvcc and the CUDA runtime; set CUDA_HOME"
  fi
fi

launcher=()
if command -v ccache >/dev/null && [[ -z ${DDP_NO_CCACHE:-} ]]; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$DDP_ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
fi
generator=()
[[ ! -f $build_dir/CMakeCache.txt ]] && command -v ninja >/dev/null && generator=(-G Ninja)
# TORCH_CUDA_ARCH_LIST only matters for CUDA sources, of which there are none; set it so that
# LibTorch's config does not probe for a GPU (there is none on the CI machine).
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
mkdir -p "$build_dir"
log="$build_dir/ddp-configure.log"
cmake -S "$DDP_ROOT" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCUDAToolkit_ROOT="$cuda_root" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" \
  -DDDP_PYTHON="$venv/bin/python" "${launcher[@]}" "$@" >"$log" 2>&1 ||
  { tail -30 "$log" >&2; ddp_die "configuring $build_dir failed (full log: $log)"; }
grep -q 'ddp: CUDA LibTorch' "$log" ||
  ddp_die "$build_dir was configured without CUDA: LibTorch's CMake config did not find CUDA (see $log)"
# The targets with CUDA or NCCL code paths (DDP_WITH_CUDA / USE_C10D_NCCL in the library, the CUDA
# branch of the examples' train_common, ddp_bench's and gpu_bench's CUDA modes, the GPU tests); the
# programs that only link those (train_*, allreduce_bench, ddp_micro_bench) and the rest of the test
# suite are the CPU build's, which keeps CI's CUDA step short. DDP_CUDA_TARGETS=all builds everything.
targets=(ddp ddp_examples ddp_bench gpu_bench test_gpu_units gpu_test_worker sync_bn_worker)
[[ ${DDP_CUDA_TARGETS:-} == all ]] && targets=(all)
cmake --build "$build_dir" --parallel "${DDP_JOBS:-$(nproc)}" --target "${targets[@]}"
echo "build-cuda: built against $(basename "$(dirname "$(dirname "$prefix")")") $torch_version with CUDA in $build_dir"
