#pragma once
// A large all-reduce over Gloo as several smaller ones in flight at once (see Note [Sliced
// all-reduce] in sliced_allreduce.cpp): the slicing (a pure function) and the work that completes
// when every slice has.
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include "ddp/base/worker_variables.h"
#include "ddp/distributed/process_group.h"

namespace ddp::detail {

// DDP_ALLREDUCE_SLICE_BYTES: a whole number of bytes >= 0 (0: not sliced), or "auto" (also when
// unset): kAllreduceSliceAuto. Throws ddp::InvalidArgument naming the variable otherwise.
std::int64_t allreduce_slice_bytes_from_environment(const EnvLookup& env);

// One slice of a flat tensor: elements [offset, offset + numel).
struct Slice {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  bool operator==(const Slice& other) const { return offset == other.offset && numel == other.numel; }
};

// How a tensor of `numel` elements of `element_size` bytes is sliced for slices of at most about
// `slice_bytes`: min(ceil(bytes / slice_bytes), numel) slices whose sizes differ by at most one
// element (the first ones larger), in order, covering every element once. One slice (the whole tensor) when the tensor
// is no larger than a slice, when slice_bytes <= 0 (slicing off) or when numel is 0. Pure; every
// rank computes the same slices for the same tensor.
std::vector<Slice> allreduce_slices(std::int64_t numel, std::int64_t element_size, std::int64_t slice_bytes);

// The work of a sliced all-reduce: completed when every slice's work has completed; its error is
// the first slice's error in slice order. wait(timeout) bounds the whole wait (c10d's "Operation
// timed out!" when it runs out, as Work::wait). Its future completes with the last slice.
class SlicedWork : public c10d::Work {
 public:
  SlicedWork(std::vector<c10::intrusive_ptr<c10d::Work>> slices, torch::Tensor tensor);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return {tensor_}; }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> slices_;
  torch::Tensor tensor_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // made on the first getFuture()
};

}  // namespace ddp::detail
