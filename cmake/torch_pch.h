// The headers precompiled for every target that links LibTorch: see Note [Precompiled LibTorch
// headers] in cmake/DdpPrecompiled.cmake. Only third-party headers: a change to the project's own
// never rebuilds the precompiled header.
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef USE_C10D_GLOO  // the ddp library only: Gloo's headers are its private include
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
// LibTorch's glog-style CHECK would replace Catch's in the tests; the project never uses it. See
// Note [Catch and LibTorch CHECK] in tests/catch_prelude.h.
#undef CHECK
