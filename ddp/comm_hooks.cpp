#include "ddp/comm_hooks.h"

namespace ddp {

std::optional<c10::ScalarType> wire_dtype(CommHook hook, c10::ScalarType bucket_dtype) {
  const bool wide_float = bucket_dtype == c10::ScalarType::Float || bucket_dtype == c10::ScalarType::Double;
  if (!wide_float) return std::nullopt;
  switch (hook) {
    case CommHook::fp16_compress: return c10::ScalarType::Half;
    case CommHook::bf16_compress: return c10::ScalarType::BFloat16;
    case CommHook::allreduce: break;
  }
  return std::nullopt;
}

std::optional<CommHook> parse_comm_hook(const std::string& name) {
  if (name == "allreduce") return CommHook::allreduce;
  if (name == "fp16_compress" || name == "fp16") return CommHook::fp16_compress;
  if (name == "bf16_compress" || name == "bf16") return CommHook::bf16_compress;
  return std::nullopt;
}

const char* to_string(CommHook hook) {
  switch (hook) {
    case CommHook::allreduce: return "allreduce";
    case CommHook::fp16_compress: return "fp16_compress";
    case CommHook::bf16_compress: return "bf16_compress";
  }
  return "?";
}

}  // namespace ddp
