#pragma once
// The built-in communication hooks of DistributedDataParallel (DdpOptions::comm_hook), written on
// the interface users implement (ddp/algorithms/comm.h).
#include <memory>
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

class CommHookInterface;  // ddp/algorithms/comm.h
// The built-in `hook` on the hook interface. allreduce is PyTorch's reducer without a hook (it
// asks the reducer to average on the copy, see Note [Dividing on the copy]); fp16/bf16 copy
// the bucket to the wire dtype, divide there, all-reduce, and hand the wire tensor back
// (PyTorch's fp16_compress_hook / bf16_compress_hook); buckets they cannot compress go as allreduce.
std::shared_ptr<CommHookInterface> make_comm_hook(CommHook hook);

struct PowerSgdOptions;  // ddp/algorithms/powersgd.h
// A hook by the name programs take on their command line (--comm-hook): the built-ins'
// names of parse_comm_hook, or "powersgd" (with `powersgd`'s options); nullptr for anything else.
std::shared_ptr<CommHookInterface> make_comm_hook(const std::string& name, const PowerSgdOptions& powersgd);
// The names make_comm_hook(name, ...) knows, for usage lines: "allreduce, fp16, bf16, powersgd".
const char* comm_hook_names();

}  // namespace ddp
