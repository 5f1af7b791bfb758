#pragma once
// Resolving the machine-dependent parts of a LaunchConfig at start-up: how many workers
// (--nproc_per_node gpu|cpu|auto) and which GPU each gets (--gpus). GPU facts come from a
// GpuProvider loaded on first use only, so a run without GPU flags never touches NVML.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "launcher/gpu_select.h"
#include "launcher/launch_env.h"

namespace ddp::launcher {

using GpuProviderLoader = std::function<std::unique_ptr<GpuProvider>()>;

// What the machine has. Tests pass a CPU count and a loader of a fake provider.
class MachineResources {
 public:
  MachineResources(int cpu_count, GpuProviderLoader load_gpu_provider)
      : cpu_count_(cpu_count), load_(std::move(load_gpu_provider)) {}
  // This process's CPUs (affinity) and NVML, loaded on first use.
  static MachineResources of_this_machine();

  int cpu_count() const { return cpu_count_; }
  // Every GPU; the provider is loaded once. Throws UsageError when it cannot be loaded.
  const std::vector<GpuInfo>& gpus();

 private:
  int cpu_count_;
  GpuProviderLoader load_;
  std::optional<std::vector<GpuInfo>> gpus_;
};

// The number of workers: the number given, the CPU count, or the visible GPUs (CUDA_VISIBLE_DEVICES
// when set, else all GPUs); auto = GPUs if any (and a driver), else CPUs.
int resolve_nproc(const LaunchConfig& config, const LaunchEnvironment& env, MachineResources& machine);

// CUDA_VISIBLE_DEVICES of each local rank (empty without --gpus). Throws UsageError.
std::vector<std::string> resolve_visible_gpus(const LaunchConfig& config, int nproc, MachineResources& machine);

}  // namespace ddp::launcher
