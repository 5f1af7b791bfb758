#pragma once
// The real GpuProvider: NVML, loaded with dlopen("libnvidia-ml.so.1") only when asked for, so that
// ddp_launch has no link dependency on the GPU driver and runs on machines without one.
#include <memory>

#include "launcher/resources/gpu_select.h"

namespace ddp::launcher::resources {

// Loads NVML and initialises it. Throws UsageError when the library or a GPU driver is missing.
std::unique_ptr<GpuProvider> load_nvml_provider();

}  // namespace ddp::launcher::resources
