#include "ddp/runtime/version.h"

#include <torch/version.h>

namespace ddp {

std::string version() { return DDP_VERSION_STRING; }

std::string torch_version() { return TORCH_VERSION; }

bool built_with_cuda() {
#ifdef USE_CUDA
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
