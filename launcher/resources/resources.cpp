#include "launcher/resources/resources.h"

#include <sched.h>

#include <algorithm>

#include "ddp/base/worker_variable_names.h"
#include "launcher/resources/numa_binding.h"
#include "launcher/resources/nvml_provider.h"

namespace ddp::launcher::resources {
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

// The entries of CUDA_VISIBLE_DEVICES, trimmed ("" gives none).
std::vector<std::string> cuda_visible_entries(const std::string& value) {
  std::vector<std::string> entries;
  for (const auto& entry : config::split_list(value, ',')) entries.push_back(config::trim_blanks(entry));
  return entries;
}

// The GPU an inherited entry names (an index or a UUID prefix), or nullptr.
const GpuInfo* gpu_named(const std::string& entry, const std::vector<GpuInfo>& gpus) {
  const GpuInfo* found = nullptr;
  if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string::npos && entry.size() < 9) {
    for (const auto& g : gpus) {
      if (g.index == std::stoi(entry)) found = &g;
    }
    return found;
  }
  if (entry.rfind("GPU-", 0) != 0) return nullptr;
  for (const auto& g : gpus) {
    if (g.uuid.rfind(entry, 0) != 0) continue;
    if (found != nullptr) return nullptr;  // an ambiguous prefix names no GPU
    found = &g;
  }
  return found;
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

std::vector<VisibleGpu> visible_gpus(const EnvironmentSnapshot& env, MachineResources& machine) {
  const std::vector<GpuInfo>& all = machine.gpus();
  std::vector<VisibleGpu> visible;
  const auto inherited = env.get(env::kCudaVisibleDevices);
  if (!inherited) {
    for (const auto& g : all) visible.push_back({g, std::to_string(g.index)});
    return visible;
  }
  for (const std::string& entry : cuda_visible_entries(*inherited)) {
    if (entry.rfind("MIG-", 0) == 0) {
      throw UsageError(ddp::str("CUDA_VISIBLE_DEVICES names the MIG instance '", entry,
                                "': --nproc_per_node gpu and --gpus auto choose whole GPUs; give the number of "
                                "workers and the GPUs (--gpus 0,1 numbers the inherited entries)"));
    }
    const GpuInfo* gpu = gpu_named(entry, all);
    const bool repeated = gpu != nullptr && std::any_of(visible.begin(), visible.end(), [&](const VisibleGpu& v) {
      return v.info.index == gpu->index;
    });
    if (gpu == nullptr || repeated) break;  // as CUDA: the list ends at the first entry naming no (new) GPU
    visible.push_back({*gpu, entry});
  }
  return visible;
}

int resolve_nproc(const config::LaunchConfig& c, const EnvironmentSnapshot& env, MachineResources& machine) {
  switch (c.nproc.kind) {
    case config::NprocRequest::Kind::kNumber:
      return c.nproc.number;
    case config::NprocRequest::Kind::kCpu:
      return machine.cpu_count();
    case config::NprocRequest::Kind::kGpu: {
      const int n = static_cast<int>(visible_gpus(env, machine).size());
      if (n == 0) {
        const auto inherited = env.get(env::kCudaVisibleDevices);
        throw UsageError(inherited ? ddp::str("--nproc_per_node gpu: CUDA_VISIBLE_DEVICES='", *inherited,
                                              "' names no GPU of this machine (", describe_gpus(machine.gpus()), ")")
                                   : std::string("--nproc_per_node gpu: NVML reports no GPU"));
      }
      return n;
    }
    case config::NprocRequest::Kind::kAuto:
      try {
        if (const int n = static_cast<int>(visible_gpus(env, machine).size()); n > 0) return n;
      } catch (const UsageError&) {  // no driver: CPUs
      }
      return machine.cpu_count();
  }
  return 1;
}

std::vector<std::string> resolve_visible_gpus(const config::LaunchConfig& c, const EnvironmentSnapshot& env, int nproc,
                                              MachineResources& machine) {
  std::vector<std::string> picked;
  const auto inherited = env.get(env::kCudaVisibleDevices);
  switch (c.gpus.mode) {
    case config::GpuRequest::Mode::kNone:
    case config::GpuRequest::Mode::kList: {
      std::vector<int> numbers = c.gpus.list;
      if (c.gpus.mode == config::GpuRequest::Mode::kNone) {
        if (!c.virtual_local_rank) return {};
        for (int lr = 0; lr < nproc; ++lr) numbers.push_back(lr);  // torchrun's: local rank i gets GPU i
      }
      if (!inherited) {
        for (int gpu : numbers) picked.push_back(std::to_string(gpu));
        break;
      }
      const std::vector<std::string> entries = cuda_visible_entries(*inherited);
      for (int gpu : numbers) {  // See Note [Inherited CUDA_VISIBLE_DEVICES]: numbers within the list
        if (gpu >= static_cast<int>(entries.size())) {
          throw UsageError(ddp::str(c.gpus.mode == config::GpuRequest::Mode::kNone ? "--virtual_local_rank: local rank "
                                                                            : "--gpus names GPU ",
                                    gpu, ", but the inherited CUDA_VISIBLE_DEVICES='", *inherited, "' has ",
                                    entries.size(), " entries (numbered from 0)"));
        }
        picked.push_back(entries[gpu]);
      }
      break;
    }
    case config::GpuRequest::Mode::kAuto: {
      const int want = c.gpus.auto_count.value_or(nproc);
      if (want < nproc) throw UsageError(ddp::str("--gpus auto:", want, " is fewer GPUs than ", nproc, " workers"));
      const std::vector<VisibleGpu> visible = visible_gpus(env, machine);
      std::vector<GpuInfo> candidates;
      for (const auto& v : visible) candidates.push_back(v.info);
      if (inherited && candidates.empty()) {
        throw UsageError(ddp::str("--gpus auto: CUDA_VISIBLE_DEVICES='", *inherited, "' names no GPU of this machine (",
                                  describe_gpus(machine.gpus()), ")"));
      }
      for (int index : select_gpus(candidates, GpuSelectionOptions{want, c.allow_busy_gpus})) {
        for (const auto& v : visible) {
          if (v.info.index == index) picked.push_back(v.cuda_name);
        }
      }
      break;
    }
  }
  if (static_cast<int>(picked.size()) < nproc) {
    throw UsageError(ddp::str("--gpus gives ", picked.size(), " GPUs for ", nproc, " workers: give one GPU per worker"));
  }
  picked.resize(nproc);
  return picked;
}

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

std::vector<std::vector<int>> resolve_cpu_binding(const config::LaunchConfig& config, const EnvironmentSnapshot& env,
                                                  int nproc, const std::vector<std::string>& gpus,
                                                  MachineResources& machine, std::string& how) {
  if (config.cpu_bind == config::CpuBind::kExclusive) {
    how = "--cpu_bind exclusive";
    return exclusive_cpu_slices(machine.cpus(), nproc);
  }
  if (config.numa_binding == config::NumaBinding::kNone) return {};
  const CpuTopology topology = read_cpu_topology(machine.sysfs_root());
  // The GPU workers' GPUs (See Note [NUMA binding]): the ones chosen, else local rank i -> GPU i.
  std::vector<VisibleGpu> visible;
  std::string no_gpu;
  try {
    visible = visible_gpus(env, machine);
  } catch (const UsageError& e) {
    no_gpu = e.what();
  }
  std::vector<NumaPlacement> placements;
  if (gpus.empty() && visible.empty()) {
    placements = spread_over_nodes(topology, machine.cpus(), nproc);
    how = ddp::str("CPU workers over ", topology.node_cpus.size(), " NUMA node(s), no GPU",
                   no_gpu.empty() ? "" : " (" + no_gpu + ")");
  } else {
    std::vector<int> gpu_of;
    for (int lr = 0; lr < nproc; ++lr) {
      int found = gpus.empty() && lr < static_cast<int>(visible.size()) ? lr : -1;
      for (int v = 0; !gpus.empty() && v < static_cast<int>(visible.size()); ++v) {
        if (visible[v].cuda_name == gpus[lr]) found = v;
      }
      if (found < 0) {
        throw UsageError(ddp::str("--numa_binding binds worker i near GPU i, but ", visible.size(), " GPU(s) are visible for ",
                                  nproc, " workers", no_gpu.empty() ? "" : " (" + no_gpu + ")",
                                  "; give --gpus, or start as many workers as GPUs"));
      }
      gpu_of.push_back(found);
    }
    std::vector<int> nodes;
    for (const VisibleGpu& v : visible) {
      if (v.info.pci_bus_id.empty()) {
        throw UsageError(ddp::str("--numa_binding: NVML gives no PCI bus id of GPU ", v.info.index,
                                  " (driver too old?); use --cpu_bind exclusive"));
      }
      nodes.push_back(pci_numa_node(machine.sysfs_root(), v.info.pci_bus_id));
    }
    placements = gpu_placements(nodes, gpu_of);
    how = "GPU workers, each near its GPU";
  }
  how = ddp::str("--numa_binding ", config::numa_binding_name(config.numa_binding), " (", how, ")");
  return numa_cpu_slices(config.numa_binding, topology, machine.cpus(), placements);
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

}  // namespace ddp::launcher::resources
