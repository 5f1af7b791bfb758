#include "ddp/comm_hooks.h"

namespace ddp {

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

}  // namespace ddp
