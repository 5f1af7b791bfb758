#include "launcher/resources.h"

#include <sched.h>

#include <algorithm>

#include "ddp/base/env_names.h"
#include "launcher/nvml_provider.h"

namespace ddp::launcher {
namespace {

std::vector<int> usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
    }
  }
  if (cpus.empty()) cpus.push_back(0);  // affinity unreadable: count one CPU, bind nothing beyond it
  return cpus;
}

int visible_gpu_count(const EnvironmentSnapshot& env, MachineResources& machine) {
  if (auto cvd = env.get(env::kCudaVisibleDevices)) {
    if (cvd->empty()) return 0;
    return static_cast<int>(std::count(cvd->begin(), cvd->end(), ',')) + 1;
  }
  return static_cast<int>(machine.gpus().size());
}

}  // namespace

MachineResources::MachineResources(int cpu_count, GpuProviderLoader load_gpu_provider)
    : load_(std::move(load_gpu_provider)) {
  for (int cpu = 0; cpu < cpu_count; ++cpu) cpus_.push_back(cpu);
}

MachineResources MachineResources::of_this_machine() { return MachineResources(usable_cpus(), load_nvml_provider); }

const std::vector<GpuInfo>& MachineResources::gpus() {
  if (!gpus_) gpus_ = load_()->gpus();
  return *gpus_;
}

int resolve_nproc(const LaunchConfig& c, const EnvironmentSnapshot& env, MachineResources& machine) {
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
      picked = select_gpus(machine.gpus(), GpuSelectionOptions{want, c.allow_busy_gpus});
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

namespace ddp::launcher {

std::vector<std::vector<int>> exclusive_cpu_slices(const std::vector<int>& cpus, int nproc) {
  const int n = static_cast<int>(cpus.size());
  if (nproc < 1 || n < nproc) {
    throw UsageError(ddp::str("--cpu_bind exclusive needs a CPU per worker: ", nproc, " workers, ", n,
                              " CPUs (", format_cpu_list(cpus), "); start fewer workers or use --cpu_bind none"));
  }
  std::vector<std::vector<int>> slices;
  int next = 0;
  for (int rank = 0; rank < nproc; ++rank) {
    const int size = n / nproc + (rank < n % nproc ? 1 : 0);
    slices.emplace_back(cpus.begin() + next, cpus.begin() + next + size);
    next += size;
  }
  return slices;
}

std::vector<std::vector<int>> resolve_cpu_binding(const LaunchConfig& config, int nproc, const MachineResources& machine) {
  if (config.cpu_bind == CpuBind::kNone) return {};
  return exclusive_cpu_slices(machine.cpus(), nproc);
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return out;
}

}  // namespace ddp::launcher
