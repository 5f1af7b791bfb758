#pragma once
// Training state as bytes for another rank (internal): the state a joiner receives in live recovery
// (See Note [Live recovery] in ddp/elastic/fault_tolerant.h) and the optimizer shards that ZeRO's
// consolidate_state_dict gathers. Plain data only, nothing is unpickled, so a peer's bytes cannot run code.
#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

#include "ddp/checkpoint/detail/pickle_reader.h"

namespace ddp::detail {

// Note [Live state on the wire]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A sequence of fields in this host's byte order (the ranks of a job share it): 64-bit integers and
// doubles, strings as length + bytes, tensors as dtype, dims, sizes and their raw CPU bytes, and
// c10 IValues (an optimizer's state dict) as a one-letter tag followed by the value: N none, B bool,
// I integer, D double, S string, T tensor, L list, U tuple, M dict (count, then key and value).
class StateWriter {
 public:
  // Room for `bytes` in all, so that gigabytes of tensors are appended without reallocating.
  void reserve(std::size_t bytes) { bytes_.reserve(bytes); }
  void integer(std::int64_t value);
  void real(double value);
  void text(const std::string& value);
  void tensor(const torch::Tensor& value);
  void value(const c10::IValue& value);
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Reads what StateWriter wrote; throws ddp::CommunicationError "<origin> is malformed at byte N: ..."
// when the bytes end early or hold something else (origin: "live recovery: the state from rank 3").
class StateReader {
 public:
  StateReader(const std::string& bytes, std::string origin) : bytes_(bytes), origin_(std::move(origin)) {}
  std::int64_t integer();
  double real();
  std::string text();
  torch::Tensor tensor();
  detail::PickleValue value();  // the safe reader's tree, for load_optimizer_state_dict
  bool at_end() const { return offset_ == bytes_.size(); }
  [[noreturn]] void fail(const std::string& what) const;

 private:
  const char* take(std::size_t size);
  const std::string& bytes_;
  std::string origin_;
  std::size_t offset_ = 0;
};

// FNV-1a, 64 bits.
std::uint64_t fnv1a64(const std::string& bytes);

}  // namespace ddp::detail
