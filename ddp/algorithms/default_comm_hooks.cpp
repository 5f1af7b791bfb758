#include "ddp/algorithms/default_comm_hooks.h"

#include <map>

#include "ddp/algorithms/comm.h"
#include "ddp/algorithms/powersgd.h"

namespace ddp {
namespace {

// The built-in hooks: a bucket without a wire dtype (kAllreduce, or one that is not fp32/fp64) is
// averaged by the reducer and all-reduced as it is; the others are divided on their wire copy.
class BuiltinHook : public CommHookInterface {
 public:
  explicit BuiltinHook(CommHook kind) : kind_(kind) {}
  std::string name() const override { return to_string(kind_); }
  bool reducer_averages(c10::ScalarType bucket_dtype) const override {
    return !wire_dtype(kind_, bucket_dtype).has_value();
  }
  HookWork run(ProcessGroup& group, GradBucket& bucket) override {
    const auto wire_type = wire_dtype(kind_, bucket.buffer.scalar_type());
    torch::Tensor send = bucket.buffer;
    if (wire_type) {
      // One wire tensor per bucket, kept across iterations (a rebuild changes the sizes).
      torch::Tensor& wire = wires_[bucket.index];
      if (!wire.defined() || wire.numel() != bucket.buffer.numel() || wire.device() != bucket.buffer.device()) {
        wire = torch::empty({bucket.buffer.numel()}, bucket.buffer.options().dtype(*wire_type));
      }
      wire.copy_(bucket.buffer);
      if (bucket.divisor != 1) wire.div_(bucket.divisor);
      send = wire;
    }
    return allreduce_average(group, send, 1, "gradient all-reduce", static_cast<int>(bucket.index));
  }

 private:
  CommHook kind_;
  std::map<std::size_t, torch::Tensor> wires_;
};

}  // namespace

std::optional<c10::ScalarType> wire_dtype(CommHook hook, c10::ScalarType bucket_dtype) {
  const bool wide_float = bucket_dtype == c10::ScalarType::Float || bucket_dtype == c10::ScalarType::Double;
  if (!wide_float) return std::nullopt;
  switch (hook) {
    case CommHook::kFp16Compress: return c10::ScalarType::Half;
    case CommHook::kBf16Compress: return c10::ScalarType::BFloat16;
    case CommHook::kAllreduce: break;
  }
  return std::nullopt;
}

std::optional<CommHook> parse_comm_hook(const std::string& name) {
  if (name == "allreduce") return CommHook::kAllreduce;
  if (name == "fp16_compress" || name == "fp16") return CommHook::kFp16Compress;
  if (name == "bf16_compress" || name == "bf16") return CommHook::kBf16Compress;
  return std::nullopt;
}

const char* to_string(CommHook hook) {
  switch (hook) {
    case CommHook::kAllreduce: return "allreduce";
    case CommHook::kFp16Compress: return "fp16_compress";
    case CommHook::kBf16Compress: return "bf16_compress";
  }
  return "?";
}

std::shared_ptr<CommHookInterface> make_comm_hook(CommHook hook) { return std::make_shared<BuiltinHook>(hook); }

std::shared_ptr<CommHookInterface> make_comm_hook(const std::string& name, const PowerSgdOptions& powersgd) {
  if (name == "powersgd") return std::make_shared<PowerSgdHook>(powersgd);
  if (auto builtin = parse_comm_hook(name)) return make_comm_hook(*builtin);
  return nullptr;
}

const char* comm_hook_names() { return "allreduce, fp16, bf16, powersgd"; }

}  // namespace ddp
