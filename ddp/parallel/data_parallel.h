#pragma once
// The single-process DataParallel baseline: each forward splits the batch over several devices
// (scatter), runs a replica of the module on each (replicate, parallel apply) and concatenates the
// outputs on one device (gather); backward sums the replicas' gradients into the module's parameters.
// The comparison point for DistributedDataParallel, as torch.nn.DataParallel is in PyTorch.
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ddp/base/error.h"

namespace ddp {

// DataParallel's options: a plain struct (c10d's style).
//   ddp::DataParallelOptions options;
//   options.devices = std::vector<torch::Device>{torch::kCUDA, ...};
struct DataParallelOptions {
  // The devices the batch is split over; unset: every visible CUDA device, else the CPU.
  std::optional<std::vector<torch::Device>> devices;
  // Where outputs are gathered; unset: the first device.
  std::optional<torch::Device> output_device;
  // Intra-op threads of each replica's worker thread (0: the process's setting). See Note [CPU replicas].
  int replica_threads = 0;
};

// Every visible CUDA device, or {CPU} when there is none.
std::vector<torch::Device> visible_devices();
// n times the CPU: DataParallel over n CPU replicas (--dp-replicas n). Throws ddp::InvalidArgument for n < 1.
std::vector<torch::Device> cpu_replicas(int64_t n);

namespace detail {
// Splits input along dimension 0 into at most devices.size() near-equal chunks (fewer when the batch
// is smaller), chunk i on devices[i]. Differentiable.
std::vector<torch::Tensor> scatter(const torch::Tensor& input, const std::vector<torch::Device>& devices);
// Concatenates the outputs along dimension 0 on device. Differentiable.
torch::Tensor gather(const std::vector<torch::Tensor>& outputs, torch::Device device);
// Copies every buffer of `from` (a replica) into the buffer of the same name in `to`, without autograd.
void copy_buffers(const torch::nn::Module& from, torch::nn::Module& to);
// Logs that DataParallel runs on one device (once per DataParallel).
void log_single_device(const std::vector<torch::Device>& devices);
// Makes the gradients that reach each replica's parameters add up in the module's parameters.
// See Note [DataParallel gradients].
void reduce_gradients_into(const std::vector<std::shared_ptr<torch::nn::Module>>& replicas,
                           torch::nn::Module& module);
// Runs modules[i](inputs[i]) on one thread per replica, each with the caller's thread-local state
// (grad mode, autocast) and, when intra_op_threads > 0, that many intra-op threads; rethrows the
// first failure.
std::vector<torch::Tensor> parallel_apply(
    const std::vector<std::function<torch::Tensor(const torch::Tensor&)>>& forwards,
    const std::vector<torch::Tensor>& inputs, int intra_op_threads = 0);
}  // namespace detail

// Note [DataParallel gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A replica is a deep copy (Cloneable::clone) whose parameters are new leaves, so backward stops at
// them. A hook on each replica parameter adds the gradient that arrives there into the module's
// parameter of the same name (under a mutex: on CUDA each device's backward runs on its own thread).
// When loss.backward() returns, the module's gradients hold the sum over replicas, which is the
// gradient of the whole batch, and optimizer.step() on the module's parameters follows.
// LibTorch's own torch/nn/parallel/data_parallel.h cannot be used here at all: it includes CUDA
// headers, so it does not compile against a CPU-only LibTorch.
//
// Note [CPU replicas]
// ~~~~~~~~~~~~~~~~~~~
// devices = {cpu, cpu, ...} (cpu_replicas(n)) runs n replicas in one process, each forward on its own
// std::thread; C++ has no GIL, so the replicas' forwards really run at the same time, which makes
// DataParallel comparable with DDP on a machine without GPUs. Each worker thread sets its own
// intra-op thread count (replica_threads) with at::set_num_threads: with LibTorch's OpenMP backend
// that is omp_set_num_threads, whose value is per thread (OpenMP's nthreads-var of the thread's
// implicit task), so the caller's count is unchanged (tests/ddp/test_data_parallel.cpp checks it).
// The backward is the autograd engine's: for CPU tensors it runs on the thread that called
// backward(), so the replicas' backward passes run one after the other, each with the caller's
// intra-op threads. That serial backward and the per-step clone of the module are DataParallel's
// costs against DDP's one process per replica (docs/benchmarks.md, "DataParallel vs DDP on the CPU").
//
// Note [DataParallel and buffers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch's torch::nn::parallel::data_parallel clones the module onto every device at each call, so
// updates of buffers made in forward, BatchNorm's running statistics above all, happen in the clones
// and are thrown away: a ResNet trained with it evaluates with its initial statistics. PyTorch's
// DataParallel keeps the updates of the replica on the module's own device. We do the same: after a
// forward in training mode the buffers of replica 0 are copied back into the module. LibTorch's
// version also refuses to run without CUDA; ours runs on the one device it has (CPU included).
template <class ModuleHolder>
class DataParallel {
 public:
  explicit DataParallel(ModuleHolder module, DataParallelOptions options = {})
      : module_(std::move(module)),
        devices_(options.devices ? *options.devices : visible_devices()),
        output_device_(options.output_device.value_or(devices_.empty() ? torch::kCPU : devices_.front())),
        replica_threads_(options.replica_threads) {
    DDP_CHECK(!devices_.empty(), "DataParallel needs at least one device");
    if (devices_.size() == 1) detail::log_single_device(devices_);
    module_->to(devices_.front());
  }

  // Forward on the batch split over the devices; the output lies on the output device.
  torch::Tensor forward(torch::Tensor input) {
    if (devices_.size() == 1) return module_->forward(input.to(devices_.front())).to(output_device_);
    std::vector<torch::Tensor> inputs = detail::scatter(input, devices_);
    std::vector<torch::Device> used(devices_.begin(), devices_.begin() + static_cast<std::ptrdiff_t>(inputs.size()));
    std::vector<std::shared_ptr<torch::nn::Module>> replicas;
    std::vector<std::function<torch::Tensor(const torch::Tensor&)>> forwards;
    for (const torch::Device& device : used) {
      auto replica = std::dynamic_pointer_cast<typename ModuleHolder::ContainedType>(module_->clone(device));
      DDP_CHECK(replica != nullptr, "DataParallel: clone() returned another module type");
      replicas.push_back(replica);
      forwards.emplace_back([replica](const torch::Tensor& x) { return replica->forward(x); });
    }
    if (torch::GradMode::is_enabled()) detail::reduce_gradients_into(replicas, *module_.ptr());
    std::vector<torch::Tensor> outputs = detail::parallel_apply(forwards, inputs, replica_threads_);
    // See Note [DataParallel and buffers].
    if (module_->is_training()) detail::copy_buffers(*replicas.front(), *module_.ptr());
    return detail::gather(outputs, output_device_);
  }
  torch::Tensor operator()(torch::Tensor input) { return forward(std::move(input)); }

  ModuleHolder& module() { return module_; }
  const std::vector<torch::Device>& devices() const { return devices_; }
  torch::Device output_device() const { return output_device_; }
  std::vector<torch::Tensor> parameters() const { return module_->parameters(); }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }

 private:
  ModuleHolder module_;
  std::vector<torch::Device> devices_;
  torch::Device output_device_;
  int replica_threads_ = 0;
};

}  // namespace ddp
