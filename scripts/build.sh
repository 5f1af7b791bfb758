#!/usr/bin/env bash
# Configures (Release, Ninja if present) and builds into build/ (or $DDP_BUILD_DIR).
# Extra arguments go to the CMake configure step, e.g. scripts/build.sh -DDDP_BUILD_TESTS=OFF
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

prefix=$(ddp_torch_prefix)
generator=()
if [[ ! -f $DDP_BUILD_DIR/CMakeCache.txt ]] && command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
# ccache, when installed, makes rebuilds and other checkouts of the same sources cheap; paths under
# the checkout are hashed relative to it so that two worktrees share hits. Without the sloppiness
# below ccache refuses every unit that uses the precompiled header ("could not use precompiled
# header": all the LibTorch units, Note [Precompiled LibTorch headers]); with it they are cached (a
# hit: 41.5 s -> 2.1 s for ddp/algorithms/powersgd.cpp). The .gch itself is in the hash, so a
# changed header or LibTorch misses.
launcher=()
if command -v ccache >/dev/null && [[ -z ${DDP_NO_CCACHE:-} ]]; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$DDP_ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
fi
python_arg=()
[[ -x $DDP_VENV/bin/python ]] && python_arg=(-DDDP_PYTHON="$DDP_VENV/bin/python")
cuda_args_text=$(ddp_cuda_cmake_args "$prefix")   # a plain assignment: its failure stops the script
cuda_args=()
[[ -n $cuda_args_text ]] && mapfile -t cuda_args <<<"$cuda_args_text"
# TORCH_CUDA_ARCH_LIST matters only for CUDA sources, of which there are none; set, it keeps LibTorch's
# config from probing for a GPU.
((${#cuda_args[@]})) && export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}

cmake -S "$DDP_ROOT" -B "$DDP_BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${python_arg[@]}" "${cuda_args[@]}" "${launcher[@]}" "$@" >/dev/null
# DDP_BUILD_TARGETS="t1 t2": build only these (scripts/test.sh --sanitize-ci).
targets=()
# shellcheck disable=SC2206  # split on any white space, newlines included
[[ -n ${DDP_BUILD_TARGETS:-} ]] && targets=(--target $DDP_BUILD_TARGETS)
cmake --build "$DDP_BUILD_DIR" --parallel "${DDP_JOBS:-$(nproc)}" "${targets[@]}"
