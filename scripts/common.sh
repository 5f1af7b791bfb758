# Sourced by the other scripts: paths and the LibTorch location, decided in one place.
#   LIBTORCH=/path/to/libtorch   use the official LibTorch zip instead of the venv's torch wheel
#   DDP_BUILD_DIR=build          where scripts/build.sh builds (default: build)
#   DDP_JOBS=N                   parallel compile jobs (default: number of cores)
DDP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DDP_VENV="$DDP_ROOT/.venv"
DDP_BUILD_DIR=${DDP_BUILD_DIR:-$DDP_ROOT/build}
DDP_TORCH_VERSION=2.13.0

ddp_die() { echo "error: $*" >&2; exit 1; }

# The CMake prefix under which TorchConfig.cmake lives.
ddp_torch_prefix() {
  if [[ -n ${LIBTORCH:-} ]]; then
    [[ -f $LIBTORCH/share/cmake/Torch/TorchConfig.cmake ]] ||
      ddp_die "LIBTORCH=$LIBTORCH has no share/cmake/Torch/TorchConfig.cmake: point it at the unpacked libtorch folder"
    echo "$LIBTORCH"
  else
    [[ -x $DDP_VENV/bin/python ]] || ddp_die "no virtual environment at $DDP_VENV: run scripts/setup.sh"
    "$DDP_VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null ||
      ddp_die "the venv's python cannot import torch: run scripts/setup.sh"
  fi
}
