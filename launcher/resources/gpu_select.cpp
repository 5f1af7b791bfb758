#include "launcher/resources/gpu_select.h"

#include <algorithm>
#include <cstdio>

#include "ddp/base/error.h"

namespace ddp::launcher::resources {
namespace {

std::string gib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

std::string describe_gpus(const std::vector<GpuInfo>& gpus) {
  std::string out;
  for (const auto& g : gpus) {
    if (!out.empty()) out += "; ";
    out += ddp::str("GPU ", g.index, g.name.empty() ? "" : " (" + g.name + ")", ": ", gib(g.free_bytes),
                    " free of ", gib(g.total_bytes));
    if (g.processes.empty()) {
      out += ", no processes";
    } else {
      out += ", busy:";
      for (const auto& p : g.processes) {
        out += ddp::str(" pid ", p.pid, p.name.empty() ? "" : " (" + p.name + ")", " ", gib(p.used_bytes));
      }
    }
  }
  return out;
}

std::vector<int> select_gpus(const std::vector<GpuInfo>& gpus, const GpuSelectionOptions& options) {
  std::vector<const GpuInfo*> candidates;
  for (const auto& g : gpus) {
    if (options.allow_busy || g.processes.empty()) candidates.push_back(&g);
  }
  if (static_cast<int>(candidates.size()) < options.count) {
    if (gpus.empty()) {
      throw UsageError(ddp::str("--gpus auto needs ", options.count, " GPUs, but NVML reports none"));
    }
    throw UsageError(ddp::str("--gpus auto needs ", options.count, " free GPUs, ", candidates.size(),
                              " qualify", options.allow_busy ? "" : " (GPUs with processes are refused; --allow_busy_gpus accepts them)",
                              ": ", describe_gpus(gpus)));
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const GpuInfo* a, const GpuInfo* b) {
    if (a->free_bytes != b->free_bytes) return a->free_bytes > b->free_bytes;
    return a->index < b->index;
  });
  std::vector<int> picked;
  for (int i = 0; i < options.count; ++i) picked.push_back(candidates[i]->index);
  std::sort(picked.begin(), picked.end());
  return picked;
}

}  // namespace ddp::launcher::resources
