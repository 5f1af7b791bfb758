#include "ddp/amp/autocast.h"

#include <ATen/autocast_mode.h>

#include "ddp/base/error.h"

namespace ddp::amp {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kOff: return "off";
    case Precision::kBFloat16: return "bf16";
    case Precision::kFloat16: return "fp16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  if (name == "off") return Precision::kOff;
  if (name == "bf16") return Precision::kBFloat16;
  if (name == "fp16") return Precision::kFloat16;
  throw InvalidArgument(str("the precision must be off, bf16 or fp16, not '", name, "'"));
}

c10::ScalarType scalar_type(Precision precision) {
  switch (precision) {
    case Precision::kBFloat16: return c10::ScalarType::BFloat16;
    case Precision::kFloat16: return c10::ScalarType::Half;
    case Precision::kOff: break;
  }
  throw InvalidArgument("mixed precision is off: there is no lower-precision type");
}

AutocastScope::AutocastScope(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled, bool cache_enabled)
    : device_type_(device_type) {
  if (!enabled) return;
  const bool cpu = device_type == c10::DeviceType::CPU;
  const bool cuda = device_type == c10::DeviceType::CUDA;
  if (!cpu && !cuda) {
    throw InvalidArgument(str("autocast: device type ", c10::DeviceTypeName(device_type),
                              " is not supported (CPU or CUDA)"));
  }
  if (dtype != c10::ScalarType::BFloat16 && dtype != c10::ScalarType::Half) {
    throw InvalidArgument(str("autocast: ", c10::toString(dtype), " is not a lower precision (BFloat16 or Half)"));
  }
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
  previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_enabled(device_type, true);
  at::autocast::set_autocast_dtype(device_type, dtype);
  at::autocast::set_autocast_cache_enabled(cache_enabled);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastScope::AutocastScope(c10::DeviceType device_type, Precision precision)
    : AutocastScope(device_type, precision == Precision::kOff ? c10::ScalarType::BFloat16 : scalar_type(precision),
                    precision != Precision::kOff) {}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // See Note [Autocast scope]: the outermost scope clears the cast cache.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}

}  // namespace ddp::amp
