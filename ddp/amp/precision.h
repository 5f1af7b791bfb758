#pragma once
// The precision of a mixed-precision run (torch-free, for command lines: --amp off|bf16|fp16).
#include <string>

namespace ddp::amp {

enum class Precision { kOff, kBFloat16, kFloat16 };

// "off", "bf16", "fp16".
const char* precision_name(Precision precision);
// Parses "off", "bf16" or "fp16"; throws ddp::InvalidArgument naming the accepted values otherwise.
Precision parse_precision(const std::string& name);

}  // namespace ddp::amp
