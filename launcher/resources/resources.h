#pragma once
// Resolving the machine-dependent parts of a LaunchConfig at start-up: how many workers
// (--nproc_per_node gpu|cpu|auto) and which GPU each gets (--gpus). GPU facts come from a
// GpuProvider loaded on first use only, so a run without GPU flags never touches NVML.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/resources/gpu_select.h"

namespace ddp::launcher::resources {

using GpuProviderLoader = std::function<std::unique_ptr<GpuProvider>()>;

// What the machine has. Tests pass a CPU count and a loader of a fake provider.
class MachineResources {
 public:
  MachineResources(std::vector<int> cpus, GpuProviderLoader load_gpu_provider, std::string sysfs_root = "/sys")
      : cpus_(std::move(cpus)), load_(std::move(load_gpu_provider)), sysfs_root_(std::move(sysfs_root)) {}
  // CPUs 0..cpu_count-1 (tests).
  MachineResources(int cpu_count, GpuProviderLoader load_gpu_provider);
  // This process's CPUs (affinity) and NVML, loaded on first use.
  static MachineResources of_this_machine();

  int cpu_count() const { return static_cast<int>(cpus_.size()); }
  // The CPU numbers this process may run on, ascending.
  const std::vector<int>& cpus() const { return cpus_; }
  // Every GPU; the provider is loaded once. Throws UsageError when it cannot be loaded.
  const std::vector<GpuInfo>& gpus();
  // Where the CPU and PCI topology is read (--numa_binding): /sys, or a test's fake.
  const std::string& sysfs_root() const { return sysfs_root_; }

 private:
  std::vector<int> cpus_;
  GpuProviderLoader load_;
  std::string sysfs_root_ = "/sys";
  std::optional<std::vector<GpuInfo>> gpus_;
};

// Note [Inherited CUDA_VISIBLE_DEVICES]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Slurm allocation on a node without device cgroups hands the launcher its GPUs only as
// CUDA_VISIBLE_DEVICES (indices, or GPU UUIDs "GPU-8f6c..."); NVML still shows every GPU of the
// node. So --nproc_per_node gpu and --gpus auto both work from one list, visible_gpus(): with the
// variable set, the GPUs it names, read as CUDA reads it (an index is the NVML/PCI bus index, as
// Slurm writes them and as CUDA_DEVICE_ORDER=PCI_BUS_ID, which the workers get, numbers them; a
// UUID or a unique prefix of one; the list ends at the first entry that names no GPU, or names one
// twice); without it, every GPU. gpu counts that list, auto chooses within it, and a worker's
// CUDA_VISIBLE_DEVICES is its GPU's entry as inherited (a UUID stays a UUID). --gpus 0,1 then
// numbers the inherited list's entries (as torch.cuda does in a process that inherits it), so a
// job never reaches outside its allocation. MIG instances ("MIG-...") are refused for gpu and auto:
// they are not whole GPUs that NVML's device list shows.

// A GPU the launcher may give its workers: its NVML facts and how CUDA_VISIBLE_DEVICES names it.
struct VisibleGpu {
  GpuInfo info;
  std::string cuda_name;  // the inherited entry (an index or a UUID), or the NVML index
};

// The GPUs visible to this launcher: see Note [Inherited CUDA_VISIBLE_DEVICES]. Loads the GPU
// provider; throws UsageError when it cannot.
std::vector<VisibleGpu> visible_gpus(const EnvironmentSnapshot& env, MachineResources& machine);

// The number of workers: the number given, the CPU count, or the number of visible_gpus(); auto =
// GPUs if any (and a driver), else CPUs.
int resolve_nproc(const config::LaunchConfig& config, const EnvironmentSnapshot& env, MachineResources& machine);

// CUDA_VISIBLE_DEVICES of each local rank (empty without --gpus and --virtual_local_rank), within an inherited
// CUDA_VISIBLE_DEVICES (See Note [Inherited CUDA_VISIBLE_DEVICES]). Throws UsageError.
std::vector<std::string> resolve_visible_gpus(const config::LaunchConfig& config, const EnvironmentSnapshot& env, int nproc,
                                              MachineResources& machine);

// Note [CPU binding]
// ~~~~~~~~~~~~~~~~~~
// --cpu_bind exclusive gives local rank i the i-th of nproc contiguous slices of the launcher's own
// CPUs (its affinity, so a Slurm or cgroup cpuset is respected), sizes differing by at most one,
// larger slices first. Why: unpinned, the workers' intra-op pools and communication threads all
// float over all cores, so two workers' pools can pile onto the same cores and the scheduler moves
// compute threads (cold caches) when a communication thread wakes; pinned, each worker's threads
// share only its own cores, and `taskset` on the launcher chooses which cores a job may use on a
// shared box. Binding is a sched_setaffinity in the child between fork and exec, so every thread
// and every restart inherits it. The worker gets OMP_NUM_THREADS = its CPU count unless the user set
// it (torchrun's 1 is for unpinned workers). Measured effect on the 2-vCPU VM of docs/benchmarks.md:
// within that machine's noise for C++ DDP, +17% for Python DDP (LeNet, 2 ranks).

// The CPUs of each local rank for --cpu_bind exclusive (empty for none). Throws UsageError when
// there are fewer CPUs than workers.
std::vector<std::vector<int>> exclusive_cpu_slices(const std::vector<int>& cpus, int nproc);

// Each local rank's CPUs (empty: not pinned) for --cpu_bind exclusive or --numa_binding (See Note
// [NUMA binding] in numa_binding.cpp), given the CUDA_VISIBLE_DEVICES each worker gets (`gpus`, as
// resolve_visible_gpus gives them; empty: none chosen). `how` gets a phrase of how the workers were
// placed, for the log. Throws UsageError.
std::vector<std::vector<int>> resolve_cpu_binding(const config::LaunchConfig& config, const EnvironmentSnapshot& env,
                                                  int nproc, const std::vector<std::string>& gpus,
                                                  MachineResources& machine, std::string& how);

// "0-3,8,10-11": the kernel's cpulist format, as in /proc/self/status's Cpus_allowed_list.
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace ddp::launcher::resources
