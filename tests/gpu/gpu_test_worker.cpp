// Worker of the GPU tests (tests/gpu/CMakeLists.txt, label gpu). Compiled in every build; the tests
// that need GPUs are skipped by run_gpu_test.sh (exit 77, reason printed) where there are too few.
// Each subcommand exits 0 when the behaviour holds, 1 with the reason on stderr.
//
//   count          prints "<CUDA devices> <1 if the ddp library has CUDA>" (for the skip decision)
//   nccl_lenet     world size 1 over NCCL: DDP trains the examples' LeNet exactly like plain training
//                  on the same GPU, and the loss falls; NCCL all-reduce, broadcast, barrier work
//   equivalence    --backend gloo|nccl: ranks train an MLP with SyncBatchNorm on CUDA, on uneven
//                  batches; the parameters equal single-process training on the concatenated batch
//                  (gloo: every rank on cuda:0, CUDA tensors through Gloo; nccl: one GPU per rank)
//   data_parallel  --gpus K: ddp::DataParallel over K GPUs equals plain training on one
//   checkpoint     saved from cuda:0, loads on the last GPU and on the CPU with equal values
//   auto_gpus      under ddp_launch --gpus auto: this worker sees exactly its one GPU and binds cuda:0
//   hold           takes GPU memory, writes its pid to --marker DIR, sleeps (the killed-job test)
//   env            the NCCL variables the test sets reach the worker through ddp_launch
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "ddp/checkpoint/checkpoint.h"
#include "ddp/runtime/detail/cuda_support.h"
#include "ddp/runtime/version.h"
#include "ddp/parallel/data_parallel.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/base/worker_variables.h"
#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"
#include "ddp/parallel/sync_batch_norm.h"
#include "examples/models/lenet.h"

namespace {

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void expect(bool condition, const std::string& what) {
  if (!condition) throw Failure(what);
}
void expect_close(const torch::Tensor& a, const torch::Tensor& b, double rtol, const std::string& what) {
  if (!torch::allclose(a.cpu(), b.cpu(), rtol, rtol * 1e-3)) {
    throw Failure(ddp::str(what, ": max abs difference ", (a.cpu() - b.cpu()).abs().max().item<double>()));
  }
}
std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) return argv[i + 1];
  }
  return fallback;
}
std::shared_ptr<ddp::ProcessGroup> init(const std::string& backend) {
  ddp::InitOptions init;
  init.backend = backend;
  init.timeout = std::chrono::seconds(60);
  return ddp::init_process_group(init);
}
void deterministic() {
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
}

// Synthetic Fashion-MNIST-shaped batches whose pixels depend on the label, so the loss can fall.
std::pair<torch::Tensor, torch::Tensor> lenet_batch(int step, torch::Device device) {
  torch::manual_seed(1000 + step);
  auto y = torch::randint(0, 10, {64}, torch::kLong);
  auto x = torch::randn({64, 1, 28, 28}) * 0.5 + y.to(torch::kFloat).view({64, 1, 1, 1}) / 5.0;
  return {x.to(device), y.to(device)};
}

int nccl_lenet() {
  deterministic();
  auto pg = init("nccl");
  expect(pg->backend_name() == "nccl", "backend is nccl");
  expect(pg->device() == torch::Device(torch::kCUDA, 0), "device is cuda:0, got " + pg->device().str());
  auto t = torch::full({4}, 2.0, torch::TensorOptions().device(pg->device()));
  pg->allreduce(t);
  pg->broadcast(t, 0);
  pg->barrier();
  expect(torch::equal(t.cpu(), torch::full({4}, 2.0)), "NCCL all-reduce at world size 1 keeps the values");

  using ddp::examples::models::LeNet;
  using ddp::examples::models::LeNetOptions;
  torch::manual_seed(5);
  LeNet net(LeNetOptions(1, 28));
  torch::manual_seed(5);
  LeNet plain(LeNetOptions(1, 28));
  net->to(pg->device());
  plain->to(pg->device());
  ddp::DistributedDataParallel<LeNet> model(net, pg);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD plain_optimizer(plain->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto [x, y] = lenet_batch(step, pg->device());
    auto loss = torch::nn::functional::cross_entropy(model(x), y);
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(plain->forward(x), y).backward();
    plain_optimizer.step();
    plain_optimizer.zero_grad();
    (step == 0 ? first : last) = loss.item<double>();
  }
  const auto mine = net->named_parameters();
  for (const auto& p : plain->named_parameters()) expect_close(mine[p.key()], p.value(), 1e-5, "LeNet " + p.key());
  expect(last < 0.5 * first, ddp::str("the loss falls (", first, " -> ", last, ")"));
  std::cout << "nccl_lenet: loss " << first << " -> " << last << " on " << pg->device() << "\n";
  return 0;
}

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(bool sync)
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 4))) {
    if (sync) {
      sync_bn = register_module("bn", ddp::SyncBatchNorm(16));
    } else {
      bn = register_module("bn", torch::nn::BatchNorm1d(16));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = fc1(x);
    h = sync_bn ? sync_bn(h) : bn(h);
    return fc2(torch::tanh(h));
  }
  torch::nn::Linear fc1, fc2;
  ddp::SyncBatchNorm sync_bn{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Mlp);

int equivalence(const std::string& backend) {
  auto pg = init(backend);
  const int world = pg->size(), rank = pg->rank();
  // Gloo: every rank on the first GPU (several ranks may share one); NCCL: the rank's own GPU.
  const torch::Device device = backend == "nccl" ? pg->device() : torch::Device(torch::kCUDA, 0);
  int64_t offset = 0, total = 0;
  for (int r = 0; r < world; ++r) {
    if (r < rank) offset += 3 + r;
    total += 3 + r;
  }
  const int64_t rows = 3 + rank;
  torch::manual_seed(11);
  Mlp net(true);
  torch::manual_seed(11);
  Mlp reference(false);
  net->to(device, torch::kDouble);
  reference->to(device, torch::kDouble);
  ddp::convert_sync_batchnorm(net.ptr(), pg);  // gives the declared SyncBatchNorm the group
  ddp::DdpOptions options;
  options.bucket_cap_bytes = 512;
  options.first_bucket_cap_bytes = 256;
  ddp::DistributedDataParallel<Mlp> model(net, pg, options);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 10; ++step) {
    torch::manual_seed(300 + step);
    auto x = (torch::randn({total, 8}, torch::kDouble) * 2 + 1).to(device);
    auto y = torch::randn({total, 4}, torch::kDouble).to(device);
    auto out = model(x.narrow(0, offset, rows));
    // world * sum / total: DDP's average over ranks is then the mean over the concatenated batch.
    ((out - y.narrow(0, offset, rows)).square().sum() * (static_cast<double>(world) / static_cast<double>(total) / 4))
        .backward();
    optimizer.step();
    optimizer.zero_grad();
    (reference->forward(x) - y).square().mean().backward();
    ref_optimizer.step();
    ref_optimizer.zero_grad();
  }
  const auto mine = net->named_parameters();
  for (const auto& p : reference->named_parameters()) {
    expect_close(mine[p.key()], p.value(), 1e-5, ddp::str(backend, " rank ", rank, " parameter ", p.key()));
  }
  expect_close(net->sync_bn->running_var, reference->bn->running_var, 1e-5, "running_var");
  return 0;
}

torch::nn::Sequential make_dp_net() {
  torch::manual_seed(21);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  net->to(torch::kDouble);
  return net;
}

int data_parallel(int gpus) {
  deterministic();
  std::vector<torch::Device> devices;
  for (int i = 0; i < gpus; ++i) devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
  auto net = make_dp_net();
  auto plain = make_dp_net();
  plain->to(devices.front());
  ddp::DataParallel<torch::nn::Sequential> dp(net, ddp::DataParallelOptions{devices, {}});
  torch::optim::SGD optimizer(dp.parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD plain_optimizer(plain->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(700 + step);
    auto x = torch::randn({12, 8}, torch::kDouble);
    auto y = torch::randn({12, 4}, torch::kDouble).to(devices.front());
    auto out = dp(x);
    expect(out.device() == devices.front(), "DataParallel gathers on the first device");
    (out - y).square().mean().backward();
    optimizer.step();
    optimizer.zero_grad();
    (plain->forward(x.to(devices.front())) - y).square().mean().backward();
    plain_optimizer.step();
    plain_optimizer.zero_grad();
  }
  const auto mine = net->named_parameters();
  for (const auto& p : plain->named_parameters()) {
    expect_close(mine[p.key()], p.value(), 1e-6, ddp::str("DataParallel over ", gpus, " GPU(s): ", p.key()));
  }
  return 0;
}

int checkpoint(const std::string& dir) {
  const int count = ddp::detail::cuda::device_count();
  const torch::Device first(torch::kCUDA, 0), last(torch::kCUDA, static_cast<c10::DeviceIndex>(count - 1));
  torch::manual_seed(9);
  Mlp net(false);
  net->to(first);
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(0.01));
  net->forward(torch::randn({6, 8}, torch::TensorOptions().device(first))).sum().backward();
  optimizer.step();
  const auto saved = ddp::save_checkpoint(dir, *net, &optimizer, {0, 1, {}}, 0, nullptr);
  for (const torch::Device device : {last, torch::Device(torch::kCPU)}) {
    Mlp restored(false);
    restored->to(device);
    torch::optim::Adam restored_optimizer(restored->parameters(), torch::optim::AdamOptions(0.01));
    ddp::CheckpointOptions options;
    options.map_location = device;
    ddp::load_checkpoint(saved, *restored, &restored_optimizer, options);
    const auto mine = restored->named_parameters();
    for (const auto& p : net->named_parameters()) {
      expect(mine[p.key()].device() == device, "parameter " + p.key() + " stays on " + device.str());
      expect(torch::equal(mine[p.key()].cpu(), p.value().cpu()), "parameter " + p.key() + " loaded on " + device.str());
    }
  }
  return 0;
}

int auto_gpus() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  expect(visible != nullptr && *visible != '\0', "ddp_launch --gpus auto sets CUDA_VISIBLE_DEVICES");
  expect(ddp::detail::cuda::device_count() == 1, ddp::str("the worker sees one GPU, got ", ddp::detail::cuda::device_count()));
  auto pg = init("auto");
  expect(pg->backend_name() == "nccl", "auto picks NCCL on a GPU");
  expect(pg->device() == torch::Device(torch::kCUDA, 0), "the worker binds its only GPU, cuda:0");
  std::cout << "auto_gpus: local rank " << pg->local_rank() << " got GPU " << visible << "\n";
  return 0;
}

int hold(const std::string& marker_dir, int seconds) {
  auto memory = torch::empty({64 << 20}, torch::TensorOptions().device(torch::kCUDA, 0));  // 256 MiB
  memory.fill_(1);
  ddp::detail::cuda::synchronize(memory.device());
  const auto marker = std::filesystem::path(marker_dir) / std::to_string(::getpid());
  ddp::detail::write_file_atomically(marker.string(), std::to_string(::getpid()) + "\n", 0644);
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  return 0;
}

int env() {
  const auto settings = ddp::detail::cuda::parse_nccl_settings(ddp::process_environment());
  expect(settings.nccl_variables.find("NCCL_DEBUG=INFO") != std::string::npos &&
             settings.nccl_variables.find("NCCL_SOCKET_IFNAME=lo") != std::string::npos,
         "NCCL_DEBUG and NCCL_SOCKET_IFNAME reach the worker, got '" + settings.nccl_variables + "'");
  expect(settings.async_error_handling == 1, "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 reaches the worker");
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2) throw ddp::InvalidArgument("usage: gpu_test_worker SUBCOMMAND [--flag value ...]");
  const std::string command = argv[1];
  try {
    if (command == "count") {
      std::cout << ddp::detail::cuda::device_count() << " " << (ddp::built_with_cuda() ? 1 : 0) << "\n";
      return 0;
    }
    if (command == "nccl_lenet") return nccl_lenet();
    if (command == "equivalence") return equivalence(arg(argc, argv, "backend", "gloo"));
    if (command == "data_parallel") return data_parallel(std::stoi(arg(argc, argv, "gpus", "1")));
    if (command == "checkpoint") return checkpoint(arg(argc, argv, "dir", "gpu_checkpoint"));
    if (command == "auto_gpus") return auto_gpus();
    if (command == "hold") return hold(arg(argc, argv, "marker", "."), std::stoi(arg(argc, argv, "seconds", "120")));
    if (command == "env") return env();
  } catch (const Failure& failure) {
    std::cerr << "FAILED: " << failure.what() << "\n";
    return 1;
  }
  throw ddp::InvalidArgument("unknown subcommand " + command);
}

}  // namespace

int main(int argc, char** argv) { return ddp::run_main(argc, argv, run); }
