#include "ddp/runtime/version.h"

#include <torch/version.h>

namespace ddp {

std::string version() { return DDP_VERSION_STRING; }

std::string torch_version() { return TORCH_VERSION; }

// DDP_WITH_CUDA and USE_C10D_NCCL: defined on this library for a CUDA LibTorch (See Note [CUDA
// LibTorch builds] in cmake/DdpCuda.cmake).
bool built_with_cuda() {
#ifdef DDP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool built_with_nccl() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace ddp
