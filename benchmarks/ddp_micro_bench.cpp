// DistributedDataParallel benchmarks (figures, not tests). Run under a launcher (ddp_launch or
// torchrun-compatible) for world sizes > 1; see docs/ddp.md for the commands and the figures.
//
//   ddp_micro_bench overhead   [--model lenet|mlp] [--batch 64] [--iters 200]  world size 1: DDP vs plain
//   ddp_micro_bench buckets    [--layers 16] [--width 1024] [--iters 10]       bucketed sync vs one flat all-reduce
//   ddp_micro_bench overlap    [--layers 16] [--width 1024] [--batch 64] [--registration forward|reversed]
//                              share of communication hidden, static vs rebuilt buckets in one run
//   ddp_micro_bench throughput [--model lenet|resnet18] [--batch 64] [--iters 50]  samples/s of DDP training
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <unistd.h>

#include "ddp/distributed_data_parallel.h"
#include "ddp/base/error.h"
#include "ddp/process_group.h"
#include "ddp/run_main.h"
#include "examples/models/lenet.h"
#include "examples/models/resnet.h"

namespace {

using Clock = std::chrono::steady_clock;
using Args = std::map<std::string, std::string>;

long get_int(const Args& args, const std::string& key, long fallback) {
  auto it = args.find(key);
  return it == args.end() ? fallback : std::stol(it->second);
}
std::string get(const Args& args, const std::string& key, const std::string& fallback) {
  auto it = args.find(key);
  return it == args.end() ? fallback : it->second;
}
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// --- models: the examples' LeNet (Fashion-MNIST shape) and ResNet-18 (CIFAR shape), as ddp_bench and
// benchmarks/torch_ddp_reference.py use them; and a deep MLP for the bucket and overlap figures. ------

using ddp::examples::models::LeNet;
using ddp::examples::models::LeNetOptions;
using ddp::examples::models::ResNet18;

LeNet make_lenet() { return LeNet(LeNetOptions(1, 28)); }
ResNet18 make_resnet18() { return ResNet18(3, 10); }

// A deep stack of square layers: many parameters, backward long enough to hide communication.
// reversed_registration: the layers are registered last-used first, so reverse registration order is
// the opposite of the order backward readies gradients (what Note [Bucket rebuild] is about).
struct DeepMlpImpl : torch::nn::Module {
  DeepMlpImpl(int layers, int width, bool reversed_registration = false) : layers_(static_cast<std::size_t>(layers), nullptr) {
    for (int k = 0; k < layers; ++k) {
      const int i = reversed_registration ? layers - 1 - k : k;
      layers_[static_cast<std::size_t>(i)] = register_module("fc" + std::to_string(i), torch::nn::Linear(width, width));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& layer : layers_) x = torch::relu(layer(x));
    return x;
  }
  std::vector<torch::nn::Linear> layers_;
};
TORCH_MODULE(DeepMlp);

struct Batch {
  torch::Tensor x, y;
};

Batch make_batch(const std::string& model, long batch, int classes = 10) {
  torch::manual_seed(0);
  if (model == "lenet") return {torch::randn({batch, 1, 28, 28}), torch::randint(classes, {batch})};  // Fashion-MNIST shape
  if (model == "resnet18") return {torch::randn({batch, 3, 32, 32}), torch::randint(classes, {batch})};
  throw ddp::InvalidArgument("unknown --model " + model + " (lenet or resnet18)");
}

// Trains `iters` steps (after `warmup` untimed ones) and returns the seconds of the timed ones.
template <class Model>
double train_seconds(Model& model, std::vector<torch::Tensor> params, const Batch& batch, long warmup, long iters) {
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  Clock::time_point start;
  for (long i = 0; i < warmup + iters; ++i) {
    if (i == warmup) start = Clock::now();
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(model(batch.x), batch.y).backward();
    optimizer.step();
  }
  return seconds_since(start);
}

std::shared_ptr<ddp::ProcessGroup> single_process_group() {
  const auto path = std::filesystem::temp_directory_path() / ("ddp_bench_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  return ddp::init_process_group(
      ddp::InitOptions().set_backend("gloo").set_init_method("file://" + path.string()).set_rank(0).set_world_size(1));
}

// World size 1: DDP against the plain module, alternating rounds so drift hits both alike.
int overhead(const Args& args) {
  const std::string model_name = get(args, "model", "lenet");
  const long batch = get_int(args, "batch", 64), iters = get_int(args, "iters", 200), rounds = get_int(args, "rounds", 5);
  auto pg = single_process_group();
  const Batch data = make_batch(model_name, batch);
  double plain = 0, wrapped = 0;
  const auto run = [&](auto make) {
    torch::manual_seed(1);
    auto net = make();
    auto ddp_net = make();
    ddp::DistributedDataParallel<decltype(ddp_net)> model(ddp_net, pg);
    for (long r = 0; r < rounds; ++r) {
      plain += train_seconds(net, net->parameters(), data, 5, iters);
      wrapped += train_seconds(model, model.parameters(), data, 5, iters);
    }
  };
  if (model_name == "lenet") run(make_lenet);
  else run(make_resnet18);
  const double n = static_cast<double>(rounds * iters * batch);
  std::printf("overhead model=%s batch=%ld threads=%d: plain %.1f samples/s, DDP(world 1) %.1f samples/s, DDP slower by %.2f%%\n",
              model_name.c_str(), batch, torch::get_num_threads(), n / plain, n / wrapped, 100.0 * (wrapped / plain - 1.0));
  return 0;
}

// Bucketed gradient sync (DDP's real bucket layout) against one all-reduce of the same bytes.
int buckets(const Args& args) {
  auto pg = ddp::init_process_group();
  const int layers = static_cast<int>(get_int(args, "layers", 16)), width = static_cast<int>(get_int(args, "width", 1024));
  const long iters = get_int(args, "iters", 10);
  DeepMlp net(layers, width);
  ddp::DistributedDataParallel<DeepMlp> model(net, pg);
  const auto sizes = model.stats().bucket_bytes;
  std::vector<torch::Tensor> bucket_tensors;
  std::size_t total = 0;
  for (auto bytes : sizes) {
    bucket_tensors.push_back(torch::ones({static_cast<long>(bytes / 4)}));
    total += bytes;
  }
  auto flat = torch::ones({static_cast<long>(total / 4)});
  const auto time_it = [&](auto body) {
    body();  // warm-up
    pg->barrier();
    const auto start = Clock::now();
    for (long i = 0; i < iters; ++i) body();
    return seconds_since(start) / static_cast<double>(iters);
  };
  double bucketed = 0, single = 0;
  for (int round = 0; round < 3; ++round) {
    bucketed += time_it([&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (auto& t : bucket_tensors) works.push_back(pg->allreduce_async(t));
      for (auto& w : works) pg->wait(w, "bucket all-reduce");
    });
    single += time_it([&] { pg->allreduce(flat); });
  }
  if (pg->rank() == 0) {
    const double mb = static_cast<double>(total) / (1 << 20);
    std::printf("buckets world=%d: %zu buckets, %.1f MiB: bucketed %.1f ms (%.0f MiB/s), one flat all-reduce %.1f ms "
                "(%.0f MiB/s): %.1f%% of the flat bandwidth\n",
                pg->size(), sizes.size(), mb, 1e3 * bucketed / 3, 3 * mb / bucketed, 1e3 * single / 3, 3 * mb / single,
                100.0 * single / bucketed);
  }
  return 0;
}

// The share of communication that overlaps backward, from DDP's own statistics, with and without the
// bucket rebuild (Note [Bucket rebuild]) in one run: two copies of the model, alternating rounds.
// --registration reversed registers the layers in the opposite order of their use.
int overlap(const Args& args) {
  auto pg = ddp::init_process_group();
  const int layers = static_cast<int>(get_int(args, "layers", 16)), width = static_cast<int>(get_int(args, "width", 1024));
  const long batch = get_int(args, "batch", 64), iters = get_int(args, "iters", 10), rounds = get_int(args, "rounds", 3);
  const std::string registration = get(args, "registration", "forward");
  if (registration != "forward" && registration != "reversed") {
    throw ddp::InvalidArgument("--registration must be forward or reversed, not " + registration);
  }
  const auto make = [&] {
    torch::manual_seed(0);
    return DeepMlp(layers, width, registration == "reversed");
  };
  struct Variant {
    const char* name;
    std::unique_ptr<ddp::DistributedDataParallel<DeepMlp>> model;
    std::unique_ptr<torch::optim::SGD> optimizer;
    double communication = 0, hidden = 0, exposed = 0, backward = 0, wall = 0;  // sums over the timed iterations (ms)
  };
  Variant variants[2] = {{"static buckets", nullptr, nullptr}, {"rebuilt buckets", nullptr, nullptr}};
  for (int v = 0; v < 2; ++v) {
    variants[v].model = std::make_unique<ddp::DistributedDataParallel<DeepMlp>>(
        make(), pg, ddp::DdpOptions().set_rebuild_buckets(v == 1));
    variants[v].optimizer = std::make_unique<torch::optim::SGD>(variants[v].model->parameters(), torch::optim::SGDOptions(0.001));
  }
  auto x = torch::randn({batch, width});
  const auto step = [&](Variant& variant) {
    variant.optimizer->zero_grad();
    (*variant.model)(x).square().mean().backward();
    variant.optimizer->step();
  };
  for (auto& variant : variants) {
    for (int i = 0; i < 2; ++i) step(variant);  // the first synchronized iteration rebuilds
  }
  for (long round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      Variant& variant = variants[(round + k) % 2];  // alternate which goes first
      const auto before = variant.model->stats();
      const auto start = Clock::now();
      for (long i = 0; i < iters; ++i) step(variant);
      variant.wall += 1e3 * seconds_since(start);
      const auto after = variant.model->stats();
      const auto sum = [](const ddp::DdpStats& s, double ddp::DdpStats::*field) { return s.*field * static_cast<double>(s.iterations); };
      variant.communication += sum(after, &ddp::DdpStats::communication_ms) - sum(before, &ddp::DdpStats::communication_ms);
      variant.hidden += sum(after, &ddp::DdpStats::hidden_communication_ms) - sum(before, &ddp::DdpStats::hidden_communication_ms);
      variant.exposed += sum(after, &ddp::DdpStats::exposed_wait_ms) - sum(before, &ddp::DdpStats::exposed_wait_ms);
      variant.backward += sum(after, &ddp::DdpStats::backward_compute_ms) - sum(before, &ddp::DdpStats::backward_compute_ms);
    }
  }
  if (pg->rank() == 0) {
    const double n = static_cast<double>(rounds * iters);
    std::printf("overlap world=%d layers=%d width=%d batch=%ld registration=%s, %ld rounds x %ld iterations each:\n",
                pg->size(), layers, width, batch, registration.c_str(), rounds, iters);
    for (const auto& v : variants) {
      std::printf("  %-15s %zu buckets: step %.1f ms, backward compute %.1f ms, communication %.1f ms, hidden %.1f ms "
                  "(%.0f%%), exposed wait %.1f ms\n",
                  v.name, v.model->stats().bucket_bytes.size(), v.wall / n, v.backward / n, v.communication / n,
                  v.hidden / n, v.communication > 0 ? 100.0 * v.hidden / v.communication : 0.0, v.exposed / n);
    }
    const double share0 = variants[0].communication > 0 ? variants[0].hidden / variants[0].communication : 0;
    const double share1 = variants[1].communication > 0 ? variants[1].hidden / variants[1].communication : 0;
    std::printf("  rebuilt / static: hidden share %.2fx, exposed wait %.2fx, step time %.2fx\n",
                share0 > 0 ? share1 / share0 : 0.0, variants[0].exposed > 0 ? variants[1].exposed / variants[0].exposed : 0.0,
                variants[0].wall > 0 ? variants[1].wall / variants[0].wall : 0.0);
  }
  return 0;
}

int throughput(const Args& args) {
  auto pg = ddp::init_process_group();
  const std::string model_name = get(args, "model", "lenet");
  const long batch = get_int(args, "batch", 64), iters = get_int(args, "iters", 50), warmup = get_int(args, "warmup", 5);
  const Batch data = make_batch(model_name, batch);
  double seconds = 0;
  ddp::DdpStats stats;
  // --plain 1: no DDP at all (each rank trains alone: the compute-only ceiling).
  const bool plain = get_int(args, "plain", 0) != 0;
  ddp::DdpOptions options;
  options.set_broadcast_buffers(get_int(args, "broadcast-buffers", 1) != 0)
      .set_gradient_as_bucket_view(get_int(args, "grad-view", 0) != 0);
  const auto run = [&](auto net) {
    if (plain) {
      pg->barrier();
      seconds = train_seconds(net, net->parameters(), data, warmup, iters);
      return;
    }
    ddp::DistributedDataParallel<decltype(net)> model(net, pg, options);
    pg->barrier();
    seconds = train_seconds(model, model.parameters(), data, warmup, iters);
    stats = model.stats();
  };
  if (model_name == "lenet") run(make_lenet());
  else run(make_resnet18());
  auto t = torch::tensor({seconds}, torch::kDouble);
  pg->allreduce(t, c10d::ReduceOp::MAX);
  if (pg->rank() == 0) {
    std::printf("throughput impl=%s model=%s world=%d batch/rank=%ld threads=%d: %.1f samples/s\n", plain ? "plain-no-ddp" : "ddp-cpp", model_name.c_str(),
                pg->size(), batch, torch::get_num_threads(),
                static_cast<double>(pg->size() * batch * iters) / t.item<double>());
    std::printf("  per iteration: forward %.2f ms, backward compute %.2f ms, communication %.2f ms (%.0f%% hidden), "
                "exposed wait %.2f ms, %zu buckets\n",
                stats.forward_ms, stats.backward_compute_ms, stats.communication_ms, 100.0 * stats.hidden_share(),
                stats.exposed_wait_ms, stats.bucket_bytes.size());
  }
  return 0;
}

int bench_main(int argc, char** argv) {
  if (argc < 2) throw ddp::InvalidArgument("usage: ddp_bench <overhead|buckets|overlap|throughput> [--key value ...]");
  Args args;
  for (int i = 2; i + 1 < argc; i += 2) args[std::string(argv[i]).substr(2)] = argv[i + 1];
  const std::string command = argv[1];
  if (command == "overhead") return overhead(args);
  if (command == "buckets") return buckets(args);
  if (command == "overlap") return overlap(args);
  if (command == "throughput") return throughput(args);
  throw ddp::InvalidArgument("unknown benchmark " + command);
}

}  // namespace

int main(int argc, char** argv) { return ddp::run_main(argc, argv, bench_main); }
