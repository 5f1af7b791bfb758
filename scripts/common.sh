# Sourced by the other scripts: paths and the LibTorch location, decided in one place.
#   LIBTORCH=/path/to/libtorch   use the official LibTorch zip instead of the venv's torch wheel
#   DDP_BUILD_DIR=build          where scripts/build.sh builds (default: build)
#   DDP_JOBS=N                   parallel compile jobs (default: number of cores)
#   DDP_TORCH_VERSION=2.14.1     the venv's torch wheel (default 2.13.0, the CPU wheel; 2.14.1 is the
#                                newest this machine's pip allows: its CUDA 13 wheel, which runs without a
#                                GPU). Another version gets its own venv (.venv-2.14.1) and build folder
#                                (build-2.14.1), so that switching back costs neither an install nor a build.
DDP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DDP_DEFAULT_TORCH_VERSION=2.13.0
DDP_TORCH_VERSION=${DDP_TORCH_VERSION:-$DDP_DEFAULT_TORCH_VERSION}
if [[ $DDP_TORCH_VERSION == "$DDP_DEFAULT_TORCH_VERSION" ]]; then
  DDP_VENV="$DDP_ROOT/.venv"
  DDP_BUILD_DIR=${DDP_BUILD_DIR:-$DDP_ROOT/build}
else
  [[ $DDP_TORCH_VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
    { echo "error: DDP_TORCH_VERSION=$DDP_TORCH_VERSION is not a version like 2.14.1" >&2; exit 2; }
  DDP_VENV="$DDP_ROOT/.venv-$DDP_TORCH_VERSION"
  DDP_BUILD_DIR=${DDP_BUILD_DIR:-$DDP_ROOT/build-$DDP_TORCH_VERSION}
fi

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

# The CUDA toolkit (the folder above nvcc's bin/), or nothing where there is none:
# $CUDAToolkit_ROOT or $CUDA_HOME, else /usr/local/cuda, else the nvcc on PATH.
ddp_cuda_root() {
  if [[ -n ${CUDAToolkit_ROOT:-${CUDA_HOME:-}} ]]; then
    echo "${CUDAToolkit_ROOT:-$CUDA_HOME}"
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo /usr/local/cuda
  elif command -v nvcc >/dev/null; then
    dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"
  fi
}

# CMake arguments for a LibTorch with CUDA (its TorchConfig.cmake runs Caffe2's CUDA detection, which
# needs nvcc and the CUDA runtime: Note [CUDA LibTorch builds] in cmake/DdpCuda.cmake), one a line;
# nothing for a CPU LibTorch. $1: the prefix from ddp_torch_prefix.
ddp_cuda_cmake_args() {
  local prefix=$1 cuda_root
  # The wheel's prefix is torch/share/cmake (libraries in torch/lib), the zip's the libtorch folder.
  compgen -G "$prefix/lib/libtorch_cuda.so" >/dev/null || compgen -G "$prefix/../../lib/libtorch_cuda.so" >/dev/null ||
    return 0
  cuda_root=$(ddp_cuda_root)
  [[ -n $cuda_root ]] ||
    ddp_die "this LibTorch ($prefix) has CUDA and its CMake config needs a CUDA toolkit (nvcc) to configure: set CUDA_HOME, or use the CPU wheel (DDP_TORCH_VERSION=$DDP_DEFAULT_TORCH_VERSION)"
  echo "-DCUDAToolkit_ROOT=$cuda_root"
  echo "-DCUDA_TOOLKIT_ROOT_DIR=$cuda_root"
}

# The listening TCP ports and bound UDP ports of this network namespace below the ephemeral range
# (a daemon listens on its configured port; a test's port 0 lands in the ephemeral range), one
# "tcp PORT" or "udp PORT" a line, sorted. From /proc: no iproute2 needed on a fresh machine.
ddp_listening_ports() {
  local first proto hex
  read -r first _ </proc/sys/net/ipv4/ip_local_port_range
  {
    awk 'NR > 1 && $4 == "0A" { split($2, a, ":"); print "tcp", a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null || true
    awk 'NR > 1 && $4 == "07" { split($2, a, ":"); print "udp", a[2] }' /proc/net/udp /proc/net/udp6 2>/dev/null || true
  } | while read -r proto hex; do
    if (( 16#$hex < first )); then echo "$proto $((16#$hex))"; fi
  done | sort -u
}
