// gpu_bench: one GPU, one process. Plain C++ training vs DistributedDataParallel at world size 1 over
// NCCL (and with gradient_as_bucket_view): iterations/s and peak CUDA memory (caching allocator).
// benchmarks/gpu_torch_reference.py measures Python's DDP the same way; scripts/gpu-check.sh runs both
// side by side and writes the report (docs/gpu.md).
//
//   gpu_bench --model lenet|resnet18 --batch 64 --warmup 20 --iters 200 --mode plain,ddp,ddp_view
// Prints one line per mode:
//   gpu_bench model=lenet mode=ddp batch=64 it_per_s=... step_ms=... peak_mib=... grad_mib=...
// Without a GPU (or a CUDA build) it prints why and exits 77.
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/cuda_support.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/base/error.h"
#include "ddp/process_group.h"
#include "examples/models/lenet.h"
#include "examples/models/resnet.h"

namespace {

struct Options {
  std::string model = "lenet";
  int64_t batch = 64;
  int warmup = 20;
  int iters = 200;
  std::vector<std::string> modes{"plain", "ddp", "ddp_view"};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw ddp::InvalidArgument("gpu_bench: " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model") {
      o.model = value;
    } else if (flag == "--batch") {
      o.batch = std::stoll(value);
    } else if (flag == "--warmup") {
      o.warmup = std::stoi(value);
    } else if (flag == "--iters") {
      o.iters = std::stoi(value);
    } else if (flag == "--mode") {
      o.modes.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) o.modes.push_back(item);
    } else {
      throw ddp::InvalidArgument("gpu_bench: unknown flag " + flag + " (--model, --batch, --warmup, --iters, --mode)");
    }
  }
  if (o.model != "lenet" && o.model != "resnet18") throw ddp::InvalidArgument("gpu_bench: --model lenet or resnet18");
  for (const auto& m : o.modes) {
    if (m != "plain" && m != "ddp" && m != "ddp_view") throw ddp::InvalidArgument("gpu_bench: --mode plain, ddp, ddp_view");
  }
  return o;
}

// The synthetic data of Note [Synthetic data] in benchmarks/scenarios/train.cpp, resident on the GPU:
// a pool of uint8 images whose pixels depend on the label, normalised at each step.
struct Pool {
  torch::Tensor images, labels;
  int64_t batches = 8, batch = 0;
  double mean = 0, stddev = 1;
  std::pair<torch::Tensor, torch::Tensor> get(int step) const {
    const int64_t start = (step % batches) * batch;
    auto x = images.narrow(0, start, batch).to(torch::kFloat).div_(255.0).sub_(mean).div_(stddev);
    return {x, labels.narrow(0, start, batch)};
  }
};

Pool make_pool(const Options& o, torch::Device device) {
  const bool cifar = o.model == "resnet18";
  const int64_t channels = cifar ? 3 : 1, side = cifar ? 32 : 28;
  Pool pool;
  pool.batch = o.batch;
  pool.mean = cifar ? 0.4734 : 0.2860;
  pool.stddev = cifar ? 0.2516 : 0.3530;
  torch::manual_seed(1000);
  const int64_t n = pool.batches * o.batch;
  pool.labels = torch::randint(10, {n}, torch::kLong);
  pool.images = (torch::randint(128, {n, channels, side, side}, torch::kLong) + pool.labels.view({-1, 1, 1, 1}) * 12)
                    .to(torch::kUInt8);
  pool.images = pool.images.to(device);
  pool.labels = pool.labels.to(device);
  return pool;
}

template <class Forward>
void measure(const Options& o, const std::string& mode, const Pool& pool, torch::Device device, Forward&& forward,
             const std::vector<torch::Tensor>& params) {
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  double grad_bytes = 0;
  for (const auto& p : params) grad_bytes += static_cast<double>(p.numel() * p.element_size());
  torch::Tensor loss;
  std::chrono::steady_clock::time_point start;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    if (i == o.warmup) {
      ddp::cuda::synchronize(device);
      ddp::cuda::reset_peak_memory_stats(device);
      start = std::chrono::steady_clock::now();
    }
    auto [x, y] = pool.get(i);
    loss = torch::nn::functional::cross_entropy(forward(x), y);
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
  }
  ddp::cuda::synchronize(device);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto memory = ddp::cuda::memory_stats(device);
  std::cout << std::fixed << std::setprecision(3) << "gpu_bench model=" << o.model << " mode=" << mode
            << " batch=" << o.batch << " it_per_s=" << o.iters / seconds << " step_ms=" << 1e3 * seconds / o.iters
            << " peak_mib=" << static_cast<double>(memory.peak_allocated_bytes) / (1 << 20)
            << " grad_mib=" << grad_bytes / (1 << 20) << " final_loss=" << loss.item<double>() << "\n";
}

template <class Net>
void run_mode(const Options& o, const std::string& mode, Net net, const Pool& pool, torch::Device device,
              const std::shared_ptr<ddp::ProcessGroup>& group) {
  net->to(device);
  if (mode == "plain") {
    measure(o, mode, pool, device, [&](const torch::Tensor& x) { return net->forward(x); }, net->parameters());
    return;
  }
  ddp::DistributedDataParallel<Net> model(net, group, ddp::DdpOptions().set_gradient_as_bucket_view(mode == "ddp_view"));
  measure(o, mode, pool, device, [&](const torch::Tensor& x) { return model(x); }, model.parameters());
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (!ddp::cuda::built_with_cuda() || ddp::cuda::device_count() == 0) {
    std::cout << "gpu_bench: SKIPPED: needs a CUDA build of the ddp library and a GPU (CUDA build: "
              << (ddp::cuda::built_with_cuda() ? "yes" : "no") << ", GPUs: " << ddp::cuda::device_count() << ")\n";
    return 77;
  }
  const torch::Device device(torch::kCUDA, 0);
  at::globalContext().setBenchmarkCuDNN(true);
  const Pool pool = make_pool(o, device);
  // World size 1 over NCCL through a file rendezvous: no launcher needed.
  const auto rendezvous = std::filesystem::temp_directory_path() / ("gpu_bench_" + std::to_string(::getpid()));
  std::filesystem::remove(rendezvous);
  auto group = ddp::init_process_group(ddp::InitOptions()
                                           .set_backend("nccl")
                                           .set_init_method("file://" + rendezvous.string())
                                           .set_rank(0)
                                           .set_world_size(1));
  for (const auto& mode : o.modes) {
    torch::manual_seed(0);
    if (o.model == "lenet") {
      run_mode(o, mode, ddp::examples::models::LeNet(ddp::examples::models::LeNetOptions(1, 28)), pool, device, group);
    } else {
      run_mode(o, mode, ddp::examples::models::ResNet18(), pool, device, group);
    }
  }
  group->destroy();
  std::filesystem::remove(rendezvous);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ddp::InvalidArgument& error) {
    std::cerr << error.what() << "\n";  // a bad command line; the message names the flag
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "gpu_bench: " << error.what() << "\n";
    return 1;
  }
}
