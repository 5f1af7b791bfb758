#pragma once
// CUDA and NCCL support that compiles against every LibTorch: which GPU a rank uses, the NCCL
// settings read from the environment, and the caching allocator's memory statistics. No CUDA or
// NCCL header is included here; the CUDA calls live in cuda_support.cpp behind DDP_WITH_CUDA
// (see Note [CUDA LibTorch builds] in cmake/DdpCuda.cmake).
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ddp/base/worker_variables.h"
#include "ddp/distributed/detail/collective_log.h"

namespace ddp::detail {
namespace cuda {

// CUDA devices this process sees (after CUDA_VISIBLE_DEVICES); 0 without CUDA or without a GPU.
int device_count();

// Note [Device of a rank]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Each rank computes on cuda:<LOCAL_RANK>, counted among the devices it sees. ddp_launch's --gpus
// gives every worker CUDA_VISIBLE_DEVICES listing the GPUs of its node (or one GPU per worker), so
// the launcher's choice and the library's agree: with one GPU per worker, LOCAL_RANK 3 would be
// out of range, so a worker that sees exactly one device uses cuda:0 whatever its local rank.
// Pure: returns the device index, or throws ddp::InvalidArgument naming what the rank saw.
int local_device_index(int local_rank, int local_world_size, int visible_device_count,
                       const std::optional<std::string>& cuda_visible_devices);

// Picks the device of this rank (local_device_index with the real device count and
// CUDA_VISIBLE_DEVICES) and makes it the current CUDA device of the calling thread.
torch::Device bind_local_device(int local_rank, int local_world_size, const EnvLookup& env);

// The NCCL-related settings of this process, validated (see Note [NCCL error handling]).
struct NcclSettings {
  // TORCH_NCCL_ASYNC_ERROR_HANDLING: 0 none, 1 tear down, 2 clean up only, 3 skip clean-up
  // (PyTorch's default, also ours when unset).
  int async_error_handling = 3;
  // TORCH_NCCL_BLOCKING_WAIT=1: every wait() blocks the host until the collective ends.
  bool blocking_wait = false;
  // NCCL_* variables passed through unchanged (NCCL_DEBUG, NCCL_SOCKET_IFNAME, ...), "K=V, ...".
  std::string nccl_variables;
};
// Throws ddp::InvalidArgument for a malformed value, naming the variable and the accepted values.
NcclSettings parse_nccl_settings(const EnvLookup& env);

// Memory statistics of the CUDA caching allocator for one device (torch.cuda.memory_stats).
struct MemoryStats {
  std::int64_t peak_allocated_bytes = 0;
};
// These throw ddp::InvalidArgument when the library has no CUDA or `device` is not a CUDA device.
MemoryStats memory_stats(torch::Device device);
void reset_peak_memory_stats(torch::Device device);
// Waits for all work queued on `device` (no-op for the CPU).
void synchronize(torch::Device device);

// Note [Which waits block the host]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ProcessGroupNCCL's Work::wait(timeout) with a timeout busy-waits on the host until the kernel
// ends; without one it only makes the current CUDA stream wait for the collective's end event, and
// the kernels queued after it (the forward after broadcast_buffers, SyncBatchNorm's backward after
// its all-reduce) are ordered behind it while the host goes on queueing, as in PyTorch. So every
// collective of ddp::ProcessGroup on a CUDA tensor with NCCL is waited for stream-ordered: its
// timeout is kept by c10d's NCCL watchdog (the group's timeout is ProcessGroupNCCL::Options::timeout,
// see Note [NCCL error handling] in cuda_support.cpp), which aborts the communicator and fails the
// rank. A host that reads the result (.cpu(), .item()) synchronises the stream, and so waits there.
// What blocks the host, bounded by the group's timeout: every collective over CPU tensors (the
// result is in host memory as soon as wait() returns: nothing else could order the reader after
// it), Gloo with CUDA tensors (ProcessGroupGloo stages through host memory and has no watchdog),
// barriers, and the store waits of the rendezvous, main_process_first and checkpoints.
// TORCH_NCCL_BLOCKING_WAIT=1 makes NCCL's wait() block the host again (c10d's own switch).
// Pure: how a collective of a group with backend `backend_name` on a tensor on `device` is waited for.
WaitMode wait_mode(const std::string& backend_name, const torch::Device& device);

}  // namespace cuda
}  // namespace ddp::detail
