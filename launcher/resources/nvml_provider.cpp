#include "launcher/resources/nvml_provider.h"

#include <cstdio>
#include <optional>
#include <utility>

#include "ddp/base/error.h"
#include "launcher/process/plugin_loader.h"

namespace ddp::launcher::resources {
namespace {

// The few NVML declarations we need (from NVML's documented, stable C API), so that building needs
// no CUDA headers.
using nvmlReturn = int;
using nvmlDevice = struct nvmlDeviceOpaque*;
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlProcessInfo {  // nvmlProcessInfo_t (v2/v3 layout)
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
struct NvmlUtilization {  // nvmlUtilization_t: percent of the last sample period
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlPciInfo {  // nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3)
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};
constexpr nvmlReturn kNvmlSuccess = 0;
constexpr nvmlReturn kNvmlInsufficientSize = 7;

class NvmlProvider : public GpuProvider {
 public:
  explicit NvmlProvider(process::SharedLibrary lib) : lib_(std::move(lib)) {
    if (procs_ == nullptr) procs_ = sym<decltype(procs_)>("nvmlDeviceGetComputeRunningProcesses_v2");
    if (init_() != kNvmlSuccess) {
      throw UsageError("NVML loaded but nvmlInit failed: is the GPU driver running (nvidia-smi)?");
    }
  }
  ~NvmlProvider() override { shutdown_(); }

  std::vector<GpuInfo> gpus() override {
    unsigned count = 0;
    check(count_(&count), "nvmlDeviceGetCount");
    std::vector<GpuInfo> out;
    for (unsigned i = 0; i < count; ++i) {
      nvmlDevice dev = nullptr;
      check(handle_(i, &dev), "nvmlDeviceGetHandleByIndex");
      GpuInfo info;
      info.index = static_cast<int>(i);
      char name[96] = {0};
      if (name_(dev, name, sizeof name) == kNvmlSuccess) info.name = name;
      NvmlMemory mem{};
      check(memory_(dev, &mem), "nvmlDeviceGetMemoryInfo");
      info.total_bytes = mem.total;
      info.free_bytes = mem.free;
      char uuid[96] = {0};
      if (uuid_ != nullptr && uuid_(dev, uuid, sizeof uuid) == kNvmlSuccess) info.uuid = uuid;
      NvmlUtilization util{};
      if (utilization_ != nullptr && utilization_(dev, &util) == kNvmlSuccess) info.utilization = util.gpu / 100.0;
      NvmlPciInfo pci{};
      if (pci_ != nullptr && pci_(dev, &pci) == kNvmlSuccess) {
        char id[16];  // sysfs's spelling, as /sys/bus/pci/devices names it: 0000:3b:00.0
        std::snprintf(id, sizeof id, "%04x:%02x:%02x.0", pci.domain & 0xffffu, pci.bus & 0xffu, pci.device & 0xffu);
        info.pci_bus_id = id;
      }
      std::vector<NvmlProcessInfo> procs(16);
      unsigned n = static_cast<unsigned>(procs.size());
      nvmlReturn rc = procs_(dev, &n, procs.data());
      if (rc == kNvmlInsufficientSize) {
        procs.resize(n + 8);
        n = static_cast<unsigned>(procs.size());
        rc = procs_(dev, &n, procs.data());
      }
      check(rc, "nvmlDeviceGetComputeRunningProcesses");
      for (unsigned p = 0; p < n; ++p) {
        GpuProcess gp;
        gp.pid = procs[p].pid;
        gp.used_bytes = procs[p].usedGpuMemory;
        char pname[256] = {0};
        if (proc_name_ != nullptr && proc_name_(gp.pid, pname, sizeof pname) == kNvmlSuccess) gp.name = pname;
        info.processes.push_back(gp);
      }
      out.push_back(std::move(info));
    }
    return out;
  }

 private:
  // A missing symbol is an input error (the driver is too old), not the launcher's failure.
  template <class F>
  F sym(const char* name) {
    try {
      return lib_.symbol<F>(name);
    } catch (const ddp::Error& e) {
      throw UsageError(e.what());
    }
  }
  static void check(nvmlReturn rc, const char* what) {
    if (rc != kNvmlSuccess) throw UsageError(ddp::str(what, " failed with NVML error ", rc));
  }

  // Looked up in this order, after lib_ (the first missing required one names itself).
  process::SharedLibrary lib_;
  nvmlReturn (*init_)() = sym<decltype(init_)>("nvmlInit_v2");
  nvmlReturn (*shutdown_)() = sym<decltype(shutdown_)>("nvmlShutdown");
  nvmlReturn (*count_)(unsigned*) = sym<decltype(count_)>("nvmlDeviceGetCount_v2");
  nvmlReturn (*handle_)(unsigned, nvmlDevice*) = sym<decltype(handle_)>("nvmlDeviceGetHandleByIndex_v2");
  nvmlReturn (*memory_)(nvmlDevice, NvmlMemory*) = sym<decltype(memory_)>("nvmlDeviceGetMemoryInfo");
  nvmlReturn (*name_)(nvmlDevice, char*, unsigned) = sym<decltype(name_)>("nvmlDeviceGetName");
  nvmlReturn (*procs_)(nvmlDevice, unsigned*, NvmlProcessInfo*) =  // else _v2, in the constructor
      lib_.optional_symbol<decltype(procs_)>("nvmlDeviceGetComputeRunningProcesses_v3");
  nvmlReturn (*proc_name_)(unsigned, char*, unsigned) =
      lib_.optional_symbol<decltype(proc_name_)>("nvmlSystemGetProcessName");
  // Optional: only the metrics use them.
  nvmlReturn (*uuid_)(nvmlDevice, char*, unsigned) = lib_.optional_symbol<decltype(uuid_)>("nvmlDeviceGetUUID");
  nvmlReturn (*utilization_)(nvmlDevice, NvmlUtilization*) =
      lib_.optional_symbol<decltype(utilization_)>("nvmlDeviceGetUtilizationRates");
  nvmlReturn (*pci_)(nvmlDevice, NvmlPciInfo*) =
      lib_.optional_symbol<decltype(pci_)>("nvmlDeviceGetPciInfo_v3");  // --numa_binding
};

}  // namespace

std::unique_ptr<GpuProvider> load_nvml_provider() {
  std::optional<process::SharedLibrary> lib;
  try {
    lib.emplace(process::SharedLibrary::load("libnvidia-ml.so.1", "driver too old?"));
  } catch (const ddp::Error&) {
    throw UsageError("cannot load libnvidia-ml.so.1 (no NVIDIA driver on this machine?): "
                     "use --gpus 0,1,... or run without --gpus auto / --nproc_per_node gpu");
  }
  return std::make_unique<NvmlProvider>(std::move(*lib));
}

}  // namespace ddp::launcher::resources
