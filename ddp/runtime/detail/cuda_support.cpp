#include "ddp/runtime/detail/cuda_support.h"

#include <torch/cuda.h>
#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <cstdlib>
#include <vector>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "ddp/runtime/version.h"

namespace ddp::detail {
namespace cuda {

WaitMode wait_mode(const std::string& backend_name, const torch::Device& device) {
  // See Note [Which waits block the host] in cuda_support.h.
  return backend_name == "nccl" && device.is_cuda() ? WaitMode::kStreamOrdered : WaitMode::kBlocking;
}

int device_count() { return static_cast<int>(torch::cuda::device_count()); }

int local_device_index(int local_rank, int local_world_size, int visible_device_count,
                       const std::optional<std::string>& cuda_visible_devices) {
  DDP_CHECK(local_rank >= 0 && local_rank < local_world_size, "local rank ", local_rank,
            " is outside the local world size ", local_world_size);
  const std::string seen = str(visible_device_count, " CUDA device(s) (CUDA_VISIBLE_DEVICES=",
                               cuda_visible_devices ? "'" + *cuda_visible_devices + "'" : std::string("unset"), ")");
  if (visible_device_count <= 0) {
    throw InvalidArgument(str("local rank ", local_rank, " needs a CUDA device but this process sees ", seen,
                              ": run on a machine with a GPU, check CUDA_VISIBLE_DEVICES, or use the gloo backend"));
  }
  // One device per worker (ddp_launch --gpus): each worker's only device. See Note [Device of a rank].
  if (visible_device_count == 1) return 0;
  if (local_rank < visible_device_count) return local_rank;
  throw InvalidArgument(str("local rank ", local_rank, " of ", local_world_size, " has no GPU of its own: this process sees ",
                            seen, ", devices 0..", visible_device_count - 1,
                            "; start at most one rank per GPU (--nproc_per_node ", visible_device_count,
                            ") or give each worker its GPU with ddp_launch --gpus"));
}

torch::Device bind_local_device(int local_rank, int local_world_size, const EnvLookup& env) {
  const int index = local_device_index(local_rank, local_world_size, device_count(), env(env::kCudaVisibleDevices));
#ifdef DDP_WITH_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#endif
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// Note [NCCL error handling]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// ProcessGroupNCCL reads its error handling from the environment when it is constructed; there is
// no option for it in ProcessGroupNCCL::Options (checked in the 2.13 and 2.14 headers). Its
// watchdog thread checks every collective against the group's timeout (Options::timeout, which we
// set to InitOptions::timeout) and, with TORCH_NCCL_ASYNC_ERROR_HANDLING on (3, the default, or 1),
// aborts the communicators and tears the process down after logging which collective failed, so a
// hung or failed collective never blocks forever; ddp_launch then reports the rank's failure and
// stops the others. The blocking helpers of ddp::ProcessGroup wait with the group's timeout, which
// makes ProcessGroupNCCL busy-wait on the host and throw, and we turn that into ddp::TimeoutError /
// ddp::CommunicationError naming the operation. NCCL_* variables (NCCL_DEBUG=INFO, NCCL_SOCKET_IFNAME,
// NCCL_IB_DISABLE, ...) are read by NCCL itself; ddp_launch passes the environment through.
NcclSettings parse_nccl_settings(const EnvLookup& env) {
  NcclSettings settings;
  for (const char* name : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}) {
    if (auto value = env(name)) {
      try {
        settings.async_error_handling = parse_int(*value, name, 0, 3);
      } catch (const InvalidArgument&) {
        throw InvalidArgument(str(name, "='", *value, "' is not one of 0 (no handling), 1 (tear down), ",
                                  "2 (clean up only), 3 (skip clean-up, the default)"));
      }
      break;
    }
  }
  for (const char* name : {"TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"}) {
    if (auto value = env(name)) {
      if (*value != "0" && *value != "1") {
        throw InvalidArgument(str(name, "='", *value, "' must be 0 or 1"));
      }
      settings.blocking_wait = *value == "1";
      break;
    }
  }
  std::vector<std::string> passed;
  for (const char* name : {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE",
                           "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_ALGO", "NCCL_PROTO"}) {
    if (auto value = env(name)) passed.push_back(str(name, "=", *value));
  }
  settings.nccl_variables = join(passed, ", ");
  return settings;
}

namespace {
void check_cuda_device(torch::Device device, const char* what) {
  if (!device.is_cuda()) throw InvalidArgument(str(what, " needs a CUDA device, got ", device.str()));
  if (!ddp::built_with_cuda()) {
    throw InvalidArgument(str(what, ": the ddp library was built against a LibTorch without CUDA ",
                              "(build with scripts/build-cuda.sh)"));
  }
  if (device.index() >= device_count()) {
    throw InvalidArgument(str(what, ": ", device.str(), " does not exist; this process sees ", device_count(),
                              " CUDA device(s)"));
  }
}
}  // namespace

MemoryStats memory_stats(torch::Device device) {
  check_cuda_device(device, "memory_stats");
  MemoryStats out;
#ifdef DDP_WITH_CUDA
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
  constexpr auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  out.peak_allocated_bytes = stats.allocated_bytes[all].peak;
#endif
  return out;
}

void reset_peak_memory_stats(torch::Device device) {
  check_cuda_device(device, "reset_peak_memory_stats");
#ifdef DDP_WITH_CUDA
  c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
#endif
}

void synchronize(torch::Device device) {
  if (!device.is_cuda()) return;
  check_cuda_device(device, "synchronize");
  torch::cuda::synchronize(device.index());
}

}  // namespace cuda
}  // namespace ddp::detail
