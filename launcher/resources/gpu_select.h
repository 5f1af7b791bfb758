#pragma once
// Choosing GPUs for --gpus auto: pure selection over an abstract provider of GPU facts, so tests
// use a fake and the launcher uses NVML loaded at run time (nvml_provider.h).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher::resources {

struct GpuProcess {
  unsigned pid = 0;
  std::string name;         // may be empty when NVML cannot tell
  std::uint64_t used_bytes = 0;
};

struct GpuInfo {
  int index = 0;            // NVML index (PCI bus order)
  std::string name;
  std::uint64_t total_bytes = 0;
  std::uint64_t free_bytes = 0;
  std::vector<GpuProcess> processes;  // compute processes holding the GPU
  std::string uuid;                     // for the metrics (may be empty)
  std::optional<double> utilization;    // 0..1, for the metrics, when NVML tells
  std::string pci_bus_id;               // "0000:3b:00.0" (sysfs's spelling), for --numa_binding; may be empty
};

// Source of GPU facts. The real one is NVML; tests give a fake.
class GpuProvider {
 public:
  virtual ~GpuProvider() = default;
  // Every GPU of the machine. Throws ddp::Error when the facts cannot be read.
  virtual std::vector<GpuInfo> gpus() = 0;
};

struct GpuSelectionOptions {
  int count = 1;                 // how many GPUs to pick
  bool allow_busy = false;       // accept GPUs that other processes hold
};

// Picks `count` GPUs: those without processes (unless allow_busy), most free memory first, ties by
// index; the result is sorted by index so local rank order follows the bus order. Throws UsageError
// listing every GPU with its free memory and processes when fewer than `count` qualify.
std::vector<int> select_gpus(const std::vector<GpuInfo>& gpus, const GpuSelectionOptions& options);

// One line per GPU, e.g. "GPU 1 (H100): 3.2 GiB free of 80.0 GiB, busy: pid 4242 (python) 70.1 GiB".
std::string describe_gpus(const std::vector<GpuInfo>& gpus);

}  // namespace ddp::launcher::resources
