#pragma once
// Process-group set-up and cross-rank reductions shared by the scenarios (header-only: it adds no
// LibTorch translation unit).
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#ifdef DDP_BENCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "benchmarks/harness.h"

#include "ddp/base/detail/process_memory.h"
#include "ddp/distributed/process_group.h"

namespace ddp::bench {

// True when a launcher (ddp_launch, torchrun) started this process (it sets WORLD_SIZE).
inline bool under_launcher() { return std::getenv("WORLD_SIZE") != nullptr; }

// A group of one (Gloo, or NCCL on one GPU) over a file store, for a benchmark started without a launcher.
inline std::shared_ptr<ProcessGroup> single_process_group(const std::string& backend = "gloo") {
  const auto path = std::filesystem::temp_directory_path() / ("ddp_bench_store_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  InitOptions init;
  init.backend = backend;
  init.init_method = "file://" + path.string();
  init.rank = 0;
  init.world_size = 1;
  auto group = init_process_group(init);
  std::filesystem::remove(path);
  return group;
}

// The launcher's group (env://), or a group of one over a file store when started alone.
inline std::shared_ptr<ProcessGroup> bench_process_group() {
  if (!under_launcher()) return single_process_group();
  InitOptions init;
  init.backend = "gloo";
  return init_process_group(init);
}

// init_process_group already shares the cores out among local ranks (see Note [Threads per rank] in
// ddp/distributed/process_group.cpp) or applies OMP_NUM_THREADS; --threads overrides both. Returns the count in use.
inline int configure_threads(int requested) {
  if (requested > 0) torch::set_num_threads(requested);
  return torch::get_num_threads();
}

// value reduced over the group (MAX or SUM); value itself without a group.
inline double reduce(ProcessGroup* group, double value, c10d::ReduceOp op) {
  if (group == nullptr || group->size() == 1) return value;
  auto tensor = torch::tensor({value}, torch::kDouble);
  group->allreduce(tensor, op);
  return tensor.item<double>();
}

// value of every rank, in rank order (just value without a group).
inline std::vector<double> gather(ProcessGroup* group, double value) {
  if (group == nullptr || group->size() == 1) return {value};
  std::vector<double> out;
  for (const auto& t : group->allgather(torch::tensor({value}, torch::kDouble))) out.push_back(t.item<double>());
  return out;
}

// Peak memory of this rank on `device` since reset_peak_device_memory(device), in bytes: the CUDA
// caching allocator's peak of allocated bytes on a GPU (compiled in where LibTorch has CUDA), the
// resident set's high-water mark (VmHWM) on the CPU.
inline int64_t peak_device_memory(torch::Device device) {
#ifdef DDP_BENCH_CUDA
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
  }
#endif
  (void)device;
  return detail::peak_rss_bytes();
}
// Starts a new peak for peak_device_memory. Returns what the peak measures: "cuda_allocated",
// "rss_hwm", or "rss_hwm_process" when the kernel refused the reset (the peak is the process's).
inline std::string reset_peak_device_memory(torch::Device device) {
#ifdef DDP_BENCH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    return "cuda_allocated";
  }
#endif
  (void)device;
  return detail::reset_peak_rss() ? "rss_hwm" : "rss_hwm_process";
}

}  // namespace ddp::bench
