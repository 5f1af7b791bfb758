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
python_arg=()
[[ -x $DDP_VENV/bin/python ]] && python_arg=(-DDDP_PYTHON="$DDP_VENV/bin/python")

cmake -S "$DDP_ROOT" -B "$DDP_BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" "${python_arg[@]}" "$@" >/dev/null
cmake --build "$DDP_BUILD_DIR" --parallel "${DDP_JOBS:-$(nproc)}"
