#include "ddp/parallel/data_parallel.h"

#include <exception>
#include <mutex>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include "ddp/runtime/log.h"

namespace ddp {

std::vector<torch::Device> visible_devices() {
  std::vector<torch::Device> devices;
  const auto count = static_cast<int>(torch::cuda::device_count());
  for (int i = 0; i < count; ++i) devices.emplace_back(torch::kCUDA, static_cast<torch::DeviceIndex>(i));
  if (devices.empty()) devices.emplace_back(torch::kCPU);
  return devices;
}

std::vector<torch::Device> cpu_replicas(int64_t n) {
  if (n < 1) throw InvalidArgument(str("DataParallel needs at least one CPU replica, not ", n));
  return std::vector<torch::Device>(static_cast<size_t>(n), torch::Device(torch::kCPU));
}

namespace detail {

std::vector<torch::Tensor> scatter(const torch::Tensor& input, const std::vector<torch::Device>& devices) {
  DDP_CHECK(input.dim() >= 1 && input.size(0) >= 1, "DataParallel needs a non-empty batch");
  const int64_t batch = input.size(0);
  const auto n = std::min<int64_t>(static_cast<int64_t>(devices.size()), batch);
  std::vector<torch::Tensor> chunks;
  int64_t start = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t size = batch / n + (i < batch % n ? 1 : 0);
    chunks.push_back(input.narrow(0, start, size).to(devices[static_cast<size_t>(i)]));
    start += size;
  }
  return chunks;
}

torch::Tensor gather(const std::vector<torch::Tensor>& outputs, torch::Device device) {
  std::vector<torch::Tensor> moved;
  moved.reserve(outputs.size());
  for (const auto& output : outputs) moved.push_back(output.to(device));
  return torch::cat(moved, 0);
}

void copy_buffers(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto source = from.named_buffers();
  for (auto& target : to.named_buffers()) {
    const torch::Tensor* value = source.find(target.key());
    DDP_CHECK(value != nullptr, "replica has no buffer ", target.key());
    target.value().copy_(*value);
  }
}

void log_single_device(const std::vector<torch::Device>& devices) {
  Logger("data_parallel").info(str("DataParallel: ", static_cast<int>(torch::cuda::device_count()),
                                   " CUDA device(s) visible; running on the one device ",
                                   devices.front().str(), " without splitting the batch"));
}

void reduce_gradients_into(const std::vector<std::shared_ptr<torch::nn::Module>>& replicas,
                           torch::nn::Module& module) {
  auto mutex = std::make_shared<std::mutex>();
  const auto targets = module.named_parameters();
  for (const auto& replica : replicas) {
    for (auto& parameter : replica->named_parameters()) {
      if (!parameter.value().requires_grad()) continue;
      const torch::Tensor* target = targets.find(parameter.key());
      DDP_CHECK(target != nullptr, "replica has no parameter ", parameter.key());
      torch::Tensor destination = *target;
      parameter.value().register_hook([destination, mutex](const torch::Tensor& grad) {
        torch::Tensor g = grad.to(destination.device());
        std::lock_guard<std::mutex> lock(*mutex);
        if (destination.grad().defined()) {
          destination.mutable_grad().add_(g);
        } else {
          destination.mutable_grad() = g.clone();
        }
      });
    }
  }
}

std::vector<torch::Tensor> parallel_apply(
    const std::vector<std::function<torch::Tensor(const torch::Tensor&)>>& forwards,
    const std::vector<torch::Tensor>& inputs, int intra_op_threads) {
  DDP_CHECK_EQ(forwards.size(), inputs.size(), "one input per replica");
  std::vector<torch::Tensor> outputs(inputs.size());
  std::vector<std::exception_ptr> errors(inputs.size());
  // Grad mode and autocast are thread-local: the workers run under the caller's.
  const at::ThreadLocalState caller_state;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < inputs.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        at::ThreadLocalStateGuard state(caller_state);
        if (intra_op_threads > 0) at::set_num_threads(intra_op_threads);  // See Note [CPU replicas].
        c10::DeviceGuard guard(inputs[i].device());
        outputs[i] = forwards[i](inputs[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return outputs;
}

}  // namespace detail
}  // namespace ddp
