#pragma once
#include <string>

namespace ddp {

// This library's version, e.g. "0.1.0".
std::string version();
// The LibTorch version the library was compiled against, e.g. "2.13.0".
std::string torch_version();
// Whether the LibTorch in use was built with CUDA and with c10d's NCCL backend.
bool built_with_cuda();
bool built_with_nccl();

}  // namespace ddp
