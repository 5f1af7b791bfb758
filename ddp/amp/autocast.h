#pragma once
// Mixed precision, part one: an RAII autocast scope over at::autocast's C++ API (the C++ twin of
// Python's `with torch.autocast(device_type, dtype):`). The loss scaler is ddp/amp/grad_scaler.h.
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include "ddp/amp/precision.h"

namespace ddp::amp {

// kBFloat16 or kHalf; throws ddp::InvalidArgument for kOff.
c10::ScalarType scalar_type(Precision precision);

// Note [Autocast scope]
// ~~~~~~~~~~~~~~~~~~~~~
// at::autocast keeps its switches (enabled, dtype, cache) per device type in thread-local state, so
// a scope enables autocast for the calling thread only and restores the previous switches when it
// ends (scopes nest, as Python's context manager does). When the outermost scope ends the cast cache
// (weights cast once per forward) is cleared, as Python's __exit__ does. Work that runs on other
// threads (DataParallel's replicas) sees the scope because ddp::DataParallel carries the caller's
// thread-local state (at::ThreadLocalState) into its worker threads; autograd's backward does not
// autocast (as in PyTorch: only the forward runs under the scope).
// Allowed: CPU with bf16 or fp16, CUDA with fp16 or bf16 (the pairs PyTorch supports).
class AutocastScope {
 public:
  // enabled = false: a scope that changes nothing (for `--amp off` without a branch).
  AutocastScope(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true, bool cache_enabled = true);
  // For a Precision: kOff is a scope that changes nothing.
  AutocastScope(c10::DeviceType device_type, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_type_;
  bool active_ = false;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
  bool previous_cache_enabled_ = true;
};

}  // namespace ddp::amp
