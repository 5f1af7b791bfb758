// gpu_bench: one GPU, one process. Plain C++ training vs DistributedDataParallel at world size 1 over
// NCCL (and with gradient_as_bucket_view): iterations/s and peak CUDA memory (caching allocator).
// benchmarks/gpu_torch_reference.py measures Python's DDP the same way; scripts/gpu-check.sh runs both
// side by side and writes the report (docs/gpu.md).
//
//   gpu_bench --model lenet|resnet18 --batch 64 --warmup 20 --iters 200 --mode plain,ddp,ddp_view [--csv F] [--json F]
// A benchmark over benchmarks/harness.h. Prints one line per mode (scripts/gpu-check.sh reads them),
// then the harness's table (a correctness column: the final loss is finite):
//   gpu_bench model=lenet mode=ddp batch=64 it_per_s=... step_ms=... peak_mib=... grad_mib=...
// Without a GPU (or a CUDA build) it prints why and exits 77.
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/harness.h"
#include "benchmarks/scenarios/runtime.h"
#include "ddp/runtime/detail/cuda_support.h"
#include "ddp/runtime/version.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"
#include "examples/models/lenet.h"
#include "examples/models/resnet.h"

namespace {

using namespace ddp::bench;

struct Options {
  std::string model = "lenet";
  int64_t batch = 64;
  TimingOptions timing{20, 200};
  std::vector<std::string> modes{"plain", "ddp", "ddp_view"};
  OutputOptions output;
};

Options parse(int argc, char** argv) {
  CommandLine cli("gpu_bench", "One GPU: plain training vs DistributedDataParallel over NCCL at world size 1 "
                  "(docs/gpu.md).");
  const Options d;
  cli.add("model", "lenet | resnet18", d.model);
  cli.add("batch", "batch size", std::to_string(d.batch));
  cli.add("mode", "comma list: plain, ddp, ddp_view", "plain,ddp,ddp_view");
  cli.add_harness_flags(d.timing);
  cli.parse(argc, argv);
  Options o;
  o.model = cli.choice("model", {"lenet", "resnet18"});
  o.batch = cli.integer("batch", 1);
  o.timing = cli.timing();
  o.modes = cli.choices("mode", {"plain", "ddp", "ddp_view"});
  o.output = cli.output();
  return o;
}

// The synthetic data (see Note [Synthetic data] in benchmarks/scenarios/train.cpp), resident on the GPU:
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
             const std::vector<torch::Tensor>& params, Table& table) {
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  double grad_bytes = 0;
  for (const auto& p : params) grad_bytes += static_cast<double>(p.numel() * p.element_size());
  torch::Tensor loss;
  std::chrono::steady_clock::time_point start;
  const int64_t warmup = o.timing.warmup, iters = o.timing.iters;
  for (int64_t i = 0; i < warmup + iters; ++i) {
    if (i == warmup) {
      ddp::detail::cuda::synchronize(device);
      ddp::detail::cuda::reset_peak_memory_stats(device);
      start = std::chrono::steady_clock::now();
    }
    auto [x, y] = pool.get(static_cast<int>(i));
    loss = torch::nn::functional::cross_entropy(forward(x), y);
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
  }
  ddp::detail::cuda::synchronize(device);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto memory = ddp::detail::cuda::memory_stats(device);
  const double it_per_s = static_cast<double>(iters) / seconds, step_ms = 1e3 * seconds / static_cast<double>(iters);
  const double peak_mib = static_cast<double>(memory.peak_allocated_bytes) / (1 << 20);
  const double final_loss = loss.item<double>();
  // The key=value line scripts/gpu-check.sh reads, then the harness's row.
  std::cout << std::fixed << std::setprecision(3) << "gpu_bench model=" << o.model << " mode=" << mode
            << " batch=" << o.batch << " it_per_s=" << it_per_s << " step_ms=" << step_ms << " peak_mib=" << peak_mib
            << " grad_mib=" << grad_bytes / (1 << 20) << " final_loss=" << final_loss << "\n";
  table.add_row();
  table.set("model", o.model);
  table.set("mode", mode);
  table.set("batch", std::to_string(o.batch));
  table.set("iters", std::to_string(iters));
  table.set("it_per_s", it_per_s, 3);
  table.set("step_ms", step_ms, 3);
  table.set("peak_mib", peak_mib, 3);
  table.set("grad_mib", grad_bytes / (1 << 20), 3);
  table.set("final_loss", final_loss, 4);
  table.set("correct", std::isfinite(final_loss) ? "OK" : "FAIL");  // training diverged or broke: FAIL
}

template <class Net>
void run_mode(const Options& o, const std::string& mode, Net net, const Pool& pool, torch::Device device,
              const std::shared_ptr<ddp::ProcessGroup>& group, Table& table) {
  net->to(device);
  if (mode == "plain") {
    measure(o, mode, pool, device, [&](const torch::Tensor& x) { return net->forward(x); }, net->parameters(), table);
    return;
  }
  ddp::DdpOptions options;
  options.gradient_as_bucket_view = mode == "ddp_view";
  ddp::DistributedDataParallel<Net> model(net, group, options);
  measure(o, mode, pool, device, [&](const torch::Tensor& x) { return model(x); }, model.parameters(), table);
}

int run(const Options& o) {
  if (!ddp::built_with_cuda() || ddp::detail::cuda::device_count() == 0) {
    std::cout << "gpu_bench: SKIPPED: needs a CUDA build of the ddp library and a GPU (CUDA build: "
              << (ddp::built_with_cuda() ? "yes" : "no") << ", GPUs: " << ddp::detail::cuda::device_count() << ")\n";
    return 77;
  }
  const torch::Device device(torch::kCUDA, 0);
  at::globalContext().setBenchmarkCuDNN(true);
  const Pool pool = make_pool(o, device);
  // World size 1 over NCCL through a file rendezvous: no launcher needed.
  auto group = single_process_group("nccl");
  Table table({"model", "mode", "batch", "iters", "it_per_s", "step_ms", "peak_mib", "grad_mib", "final_loss",
               "correct"});
  for (const auto& mode : o.modes) {
    torch::manual_seed(0);
    if (o.model == "lenet") {
      run_mode(o, mode, ddp::examples::models::LeNet(ddp::examples::models::LeNetOptions(1, 28)), pool, device, group, table);
    } else {
      run_mode(o, mode, ddp::examples::models::ResNet18(), pool, device, group, table);
    }
  }
  group->destroy();
  emit(table, o.output, {{"benchmark", "gpu_bench"}, {"device", device.str()}},
       {"gpu_bench: one GPU, " + std::to_string(o.timing.warmup) + " warm-up + " + std::to_string(o.timing.iters) +
        " timed steps per mode; peak_mib: the CUDA caching allocator's peak"});
  bool correct = true;
  for (const auto& row : table.rows()) correct = correct && row.back() == "OK";
  return correct ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main(argc, argv, [](int c, char** v) { return with_usage("gpu_bench", [&] { return run(parse(c, v)); }); });
}
