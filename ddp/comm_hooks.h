#pragma once
// Communication hooks of DistributedDataParallel: what is sent for a gradient bucket.
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

namespace ddp {

enum class CommHook {
  kAllreduce,      // all-reduce the bucket as it is (default)
  kFp16Compress,   // cast to float16, all-reduce, cast back: half the bytes
  kBf16Compress,   // cast to bfloat16, all-reduce, cast back: half the bytes, float32's range
};

// The dtype a hook sends for a bucket of `bucket_dtype`; nullopt when it sends the bucket itself
// (allreduce, or a bucket that is not floating point or already that small).
std::optional<c10::ScalarType> wire_dtype(CommHook hook, c10::ScalarType bucket_dtype);

// "allreduce", "fp16_compress", "bf16_compress" (also "fp16"/"bf16"); nullopt for anything else.
std::optional<CommHook> parse_comm_hook(const std::string& name);
const char* to_string(CommHook hook);

}  // namespace ddp
