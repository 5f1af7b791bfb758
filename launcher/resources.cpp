#include "launcher/resources.h"

#include <sched.h>

#include <algorithm>

#include "launcher/nvml_provider.h"

namespace ddp::launcher {
namespace {

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return 1;
}

int visible_gpu_count(const LaunchEnvironment& env, MachineResources& machine) {
  if (auto cvd = env.get("CUDA_VISIBLE_DEVICES")) {
    if (cvd->empty()) return 0;
    return static_cast<int>(std::count(cvd->begin(), cvd->end(), ',')) + 1;
  }
  return static_cast<int>(machine.gpus().size());
}

}  // namespace

MachineResources MachineResources::of_this_machine() { return MachineResources(usable_cpu_count(), load_nvml_provider); }

const std::vector<GpuInfo>& MachineResources::gpus() {
  if (!gpus_) gpus_ = load_()->gpus();
  return *gpus_;
}

int resolve_nproc(const LaunchConfig& c, const LaunchEnvironment& env, MachineResources& machine) {
  switch (c.nproc.kind) {
    case NprocRequest::Kind::kNumber:
      return c.nproc.number;
    case NprocRequest::Kind::kCpu:
      return machine.cpu_count();
    case NprocRequest::Kind::kGpu: {
      const int n = visible_gpu_count(env, machine);
      if (n == 0) throw UsageError("--nproc_per_node gpu: no GPU is visible (CUDA_VISIBLE_DEVICES or NVML)");
      return n;
    }
    case NprocRequest::Kind::kAuto: {
      int n = 0;
      try {
        n = visible_gpu_count(env, machine);
      } catch (const UsageError&) {
        n = 0;  // no driver: CPUs
      }
      return n > 0 ? n : machine.cpu_count();
    }
  }
  return 1;
}

std::vector<std::string> resolve_visible_gpus(const LaunchConfig& c, int nproc, MachineResources& machine) {
  std::vector<int> picked;
  switch (c.gpus.mode) {
    case GpuRequest::Mode::kNone:
      return {};
    case GpuRequest::Mode::kList:
      picked = c.gpus.list;
      break;
    case GpuRequest::Mode::kAuto: {
      const int want = c.gpus.auto_count.value_or(nproc);
      if (want < nproc) throw UsageError(ddp::str("--gpus auto:", want, " is fewer GPUs than ", nproc, " workers"));
      picked = select_gpus(machine.gpus(), GpuSelectionOptions().set_count(want).set_allow_busy(c.allow_busy_gpus));
      break;
    }
  }
  if (static_cast<int>(picked.size()) < nproc) {
    throw UsageError(ddp::str("--gpus gives ", picked.size(), " GPUs for ", nproc, " workers: give one GPU per worker"));
  }
  std::vector<std::string> out;
  for (int i = 0; i < nproc; ++i) out.push_back(std::to_string(picked[i]));
  return out;
}

}  // namespace ddp::launcher
