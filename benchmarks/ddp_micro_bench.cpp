// DistributedDataParallel micro-benchmarks (figures, not tests), scenarios over benchmarks/harness.h:
// each has its own flags plus the harness's (--warmup, --iters, --csv, --append, --json,
// --no-markdown) and prints the harness's table. Run under a launcher (ddp_launch or
// torchrun-compatible) for world sizes > 1; see docs/ddp.md for the commands and the figures.
//
//   ddp_micro_bench overhead   [--model lenet|resnet18] [--batch 64] [--iters 200] [--rounds 5]  world size 1: DDP vs plain
//   ddp_micro_bench buckets    [--layers 16] [--width 1024] [--iters 10]  bucketed sync vs one flat all-reduce
//   ddp_micro_bench overlap    [--layers 16] [--width 1024] [--batch 64] [--iters 10] [--rounds 3]
//                              [--registration forward|reversed]
//                              share of communication hidden, static vs rebuilt buckets in one run
//   ddp_micro_bench throughput [--model lenet|resnet18] [--batch 64] [--iters 50] [--plain 1]
//                              [--broadcast-buffers 0|1] [--grad-view 0|1]   samples/s of DDP training
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "benchmarks/harness.h"
#include "benchmarks/scenarios/runtime.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"
#include "examples/models/lenet.h"
#include "examples/models/resnet.h"

namespace {

using namespace ddp::bench;

// --- models: the examples' LeNet (Fashion-MNIST shape) and ResNet-18 (CIFAR shape), as ddp_bench and
// benchmarks/torch_ddp_reference.py use them; and a deep MLP for the bucket and overlap figures. ------

using ddp::examples::models::LeNet;
using ddp::examples::models::LeNetOptions;
using ddp::examples::models::ResNet18;

// A deep stack of square layers: many parameters, backward long enough to hide communication.
// reversed_registration: the layers are registered last-used first, so reverse registration order is
// the opposite of the order backward readies gradients (see Note [Bucket rebuild]).
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

Batch make_batch(const std::string& model, int64_t batch) {
  torch::manual_seed(0);
  if (model == "lenet") return {torch::randn({batch, 1, 28, 28}), torch::randint(10, {batch})};  // Fashion-MNIST shape
  return {torch::randn({batch, 3, 32, 32}), torch::randint(10, {batch})};                       // CIFAR shape
}

// Trains `timing.iters` steps after `timing.warmup` untimed ones; returns the seconds of the timed ones
// and leaves the last loss in *loss.
template <class Model>
double train_seconds(Model& model, std::vector<torch::Tensor> params, const Batch& batch, const TimingOptions& timing,
                     double* loss = nullptr) {
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::Tensor last;
  const double seconds = time_loop(timing, [&] {
    optimizer.zero_grad();
    last = torch::nn::functional::cross_entropy(model(batch.x), batch.y);
    last.backward();
    optimizer.step();
  }) * static_cast<double>(timing.iters);
  if (loss != nullptr) *loss = last.item<double>();
  return seconds;
}

// The flags of one scenario: its own, then the harness's.
struct Flags {
  Flags(const std::string& scenario, const TimingOptions& timing) : cli("ddp_micro_bench " + scenario, "See docs/ddp.md.") {
    defaults = timing;
  }
  void parse(int argc, char** argv) {
    cli.add_harness_flags(defaults);
    cli.parse(argc, argv);
    timing = cli.timing();
    output = cli.output();
  }
  CommandLine cli;
  TimingOptions defaults, timing;
  OutputOptions output;
};

bool finite(double value) { return std::isfinite(value); }
const char* ok(bool correct) { return correct ? "OK" : "FAIL"; }

// World size 1: DDP against the plain module, alternating rounds so drift hits both alike.
int overhead(int argc, char** argv) {
  Flags f("overhead", TimingOptions{5, 200});
  f.cli.add("model", "lenet | resnet18", "lenet");
  f.cli.add("batch", "batch size", "64");
  f.cli.add("rounds", "alternated rounds of plain and DDP", "5");
  f.cli.add("form", "holder | reference: DDP over the TORCH_MODULE holder or the module object (Note [Module forms])",
            "holder");
  f.parse(argc, argv);
  const bool by_reference = f.cli.choice("form", {"holder", "reference"}) == "reference";
  const std::string model_name = f.cli.choice("model", {"lenet", "resnet18"});
  const int64_t batch = f.cli.integer("batch", 1), rounds = f.cli.integer("rounds", 1);
  auto pg = single_process_group();
  const Batch data = make_batch(model_name, batch);
  double plain = 0, wrapped = 0, plain_loss = 0, ddp_loss = 0;
  const auto run = [&](auto make) {
    torch::manual_seed(1);
    auto net = make();
    auto ddp_net = make();
    const auto alternate = [&](auto& model) {
      for (int64_t r = 0; r < rounds; ++r) {
        plain += train_seconds(net, net->parameters(), data, f.timing, &plain_loss);
        wrapped += train_seconds(model, model.parameters(), data, f.timing, &ddp_loss);
      }
    };
    if (by_reference) {
      ddp::DistributedDataParallel model(*ddp_net, pg);  // DistributedDataParallel<LeNetImpl>: not owning
      alternate(model);
    } else {
      ddp::DistributedDataParallel model(ddp_net, pg);  // DistributedDataParallel<LeNet>
      alternate(model);
    }
  };
  if (model_name == "lenet") run([] { return LeNet(LeNetOptions(1, 28)); });
  else run([] { return ResNet18(3, 10); });
  const double n = static_cast<double>(rounds * f.timing.iters * batch);
  Table table({"model", "batch", "threads", "impl", "samples_per_s", "final_loss", "correct"});
  const auto row = [&](const char* impl, double seconds, double loss) {
    table.add_row();
    table.set("model", model_name);
    table.set("batch", std::to_string(batch));
    table.set("threads", std::to_string(torch::get_num_threads()));
    table.set("impl", impl);
    table.set("samples_per_s", n / seconds, 1);
    table.set("final_loss", loss, 4);
    table.set("correct", ok(finite(loss)));
  };
  row("plain", plain, plain_loss);
  row("ddp (world 1)", wrapped, ddp_loss);
  emit(table, f.output, {{"scenario", "overhead"}},
       {"overhead: world size 1, DDP over the " + std::string(by_reference ? "module object" : "holder") + ", " +
            std::to_string(rounds) + " alternated rounds of " + std::to_string(f.timing.iters) +
            " steps (after " + std::to_string(f.timing.warmup) + " warm-up steps each)",
        "DDP slower by " + fixed(100.0 * (wrapped / plain - 1.0), 2) + "%"});
  return finite(plain_loss) && finite(ddp_loss) ? 0 : 1;
}

// Bucketed gradient sync (DDP's real bucket layout) against one all-reduce of the same bytes.
// Correctness: every rank fills ones, so after one all-reduce every element is the world size.
int buckets(int argc, char** argv) {
  Flags f("buckets", TimingOptions{1, 10});
  f.cli.add("layers", "MLP layers", "16");
  f.cli.add("width", "MLP width", "1024");
  f.parse(argc, argv);
  const int layers = static_cast<int>(f.cli.integer("layers", 1, 4096));
  const int width = static_cast<int>(f.cli.integer("width", 1, 1 << 16));
  auto pg = ddp::init_process_group();  // after the flags: a bad one is a usage error, launched or not
  DeepMlp net(layers, width);
  ddp::DistributedDataParallel<DeepMlp> model(net, pg);
  const auto sizes = model.stats().bucket_bytes;
  std::vector<torch::Tensor> bucket_tensors;
  std::size_t total = 0;
  for (auto bytes : sizes) {
    bucket_tensors.push_back(torch::ones({static_cast<int64_t>(bytes / 4)}));
    total += bytes;
  }
  auto flat = torch::ones({static_cast<int64_t>(total / 4)});
  const auto bucketed_step = [&] {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : bucket_tensors) works.push_back(pg->allreduce_async(t));
    for (auto& w : works) pg->wait(w, "bucket all-reduce");
  };
  // Correctness round first, on the ones.
  bucketed_step();
  pg->allreduce(flat);
  bool correct = flat.eq(pg->size()).all().item<bool>();
  for (const auto& t : bucket_tensors) correct = correct && t.eq(pg->size()).all().item<bool>();
  for (auto& t : bucket_tensors) t.zero_();  // timed rounds sum zeros
  flat.zero_();
  double bucketed = 0, single = 0;
  for (int round = 0; round < 3; ++round) {
    pg->barrier();
    bucketed += time_loop(f.timing, bucketed_step);
    pg->barrier();
    single += time_loop(f.timing, [&] { pg->allreduce(flat); });
  }
  bucketed /= 3;
  single /= 3;
  if (pg->rank() == 0) {
    const double mib = static_cast<double>(total) / (1 << 20);
    Table table({"world_size", "buckets", "MiB", "sync", "time_ms", "MiBps", "correct"});
    const auto row = [&](const char* sync, std::size_t count, double seconds) {
      table.add_row();
      table.set("world_size", std::to_string(pg->size()));
      table.set("buckets", std::to_string(count));
      table.set("MiB", mib, 1);
      table.set("sync", sync);
      table.set("time_ms", 1e3 * seconds, 1);
      table.set("MiBps", mib / seconds, 0);
      table.set("correct", ok(correct));
    };
    row("bucketed (DDP's layout)", sizes.size(), bucketed);
    row("one flat all-reduce", 1, single);
    emit(table, f.output, {{"scenario", "buckets"}},
         {"buckets: " + std::to_string(layers) + " x " + std::to_string(width) + "x" + std::to_string(width) +
              " MLP, 3 rounds of " + std::to_string(f.timing.iters) + " iterations each",
          "bucketed: " + fixed(100.0 * single / bucketed, 1) + "% of the flat bandwidth"});
  }
  return correct ? 0 : 1;
}

// The share of communication that overlaps backward, from DDP's own statistics, with and without the
// bucket rebuild (see Note [Bucket rebuild]) in one run: two copies of the model, alternating rounds.
// --registration reversed registers the layers in the opposite order of their use.
int overlap(int argc, char** argv) {
  Flags f("overlap", TimingOptions{2, 10});
  f.cli.add("layers", "MLP layers", "16");
  f.cli.add("width", "MLP width", "1024");
  f.cli.add("batch", "batch size", "64");
  f.cli.add("rounds", "alternated rounds of the two layouts", "3");
  f.cli.add("registration", "forward | reversed: the order the layers are registered in", "forward");
  f.parse(argc, argv);
  const int layers = static_cast<int>(f.cli.integer("layers", 1, 4096));
  const int width = static_cast<int>(f.cli.integer("width", 1, 1 << 16));
  const int64_t batch = f.cli.integer("batch", 1), rounds = f.cli.integer("rounds", 1);
  const std::string registration = f.cli.choice("registration", {"forward", "reversed"});
  auto pg = ddp::init_process_group();
  const auto make = [&] {
    torch::manual_seed(0);
    return DeepMlp(layers, width, registration == "reversed");
  };
  struct Variant {
    const char* name;
    std::unique_ptr<ddp::DistributedDataParallel<DeepMlp>> model;
    std::unique_ptr<torch::optim::SGD> optimizer;
    double communication = 0, hidden = 0, exposed = 0, backward = 0, wall = 0;  // sums over the timed iterations (ms)
    double loss = 0;
  };
  Variant variants[2] = {{"static buckets", nullptr, nullptr}, {"rebuilt buckets", nullptr, nullptr}};
  for (int v = 0; v < 2; ++v) {
    ddp::DdpOptions options;
    options.rebuild_buckets = v == 1;
    variants[v].model = std::make_unique<ddp::DistributedDataParallel<DeepMlp>>(make(), pg, options);
    variants[v].optimizer = std::make_unique<torch::optim::SGD>(variants[v].model->parameters(), torch::optim::SGDOptions(0.001));
  }
  auto x = torch::randn({batch, width});
  const auto step = [&](Variant& variant) {
    variant.optimizer->zero_grad();
    auto loss = (*variant.model)(x).square().mean();
    loss.backward();
    variant.optimizer->step();
    variant.loss = loss.item<double>();
  };
  TimingOptions warmup_only{f.timing.warmup, 0};
  for (auto& variant : variants) time_loop(warmup_only, [&] { step(variant); });  // the first synchronized iteration rebuilds
  TimingOptions timed{0, f.timing.iters};
  for (int64_t round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      Variant& variant = variants[(round + k) % 2];  // alternate which goes first
      const auto before = variant.model->stats();
      variant.wall += 1e3 * time_loop(timed, [&] { step(variant); }) * static_cast<double>(f.timing.iters);
      const auto after = variant.model->stats();
      const auto sum = [](const ddp::DdpStats& s, double ddp::DdpStats::*field) { return s.*field * static_cast<double>(s.iterations); };
      variant.communication += sum(after, &ddp::DdpStats::communication_ms) - sum(before, &ddp::DdpStats::communication_ms);
      variant.hidden += sum(after, &ddp::DdpStats::hidden_communication_ms) - sum(before, &ddp::DdpStats::hidden_communication_ms);
      variant.exposed += sum(after, &ddp::DdpStats::exposed_wait_ms) - sum(before, &ddp::DdpStats::exposed_wait_ms);
      variant.backward += sum(after, &ddp::DdpStats::backward_compute_ms) - sum(before, &ddp::DdpStats::backward_compute_ms);
    }
  }
  // Both copies start from the same weights and see the same data: the rebuild changes the layout,
  // never the numbers, so their losses agree.
  const bool correct = variants[0].loss == variants[1].loss && finite(variants[0].loss);
  if (pg->rank() == 0) {
    const double n = static_cast<double>(rounds * f.timing.iters);
    Table table({"layout", "buckets", "step_ms", "backward_compute_ms", "communication_ms", "hidden_ms", "hidden_pct",
                 "exposed_wait_ms", "correct"});
    for (const auto& v : variants) {
      table.add_row();
      table.set("layout", v.name);
      table.set("buckets", std::to_string(v.model->stats().bucket_bytes.size()));
      table.set("step_ms", v.wall / n, 1);
      table.set("backward_compute_ms", v.backward / n, 1);
      table.set("communication_ms", v.communication / n, 1);
      table.set("hidden_ms", v.hidden / n, 1);
      table.set("hidden_pct", v.communication > 0 ? 100.0 * v.hidden / v.communication : 0.0, 0);
      table.set("exposed_wait_ms", v.exposed / n, 1);
      table.set("correct", ok(correct));
    }
    const double share0 = variants[0].communication > 0 ? variants[0].hidden / variants[0].communication : 0;
    const double share1 = variants[1].communication > 0 ? variants[1].hidden / variants[1].communication : 0;
    emit(table, f.output, {{"scenario", "overlap"}, {"registration", registration}},
         {"overlap world=" + std::to_string(pg->size()) + " layers=" + std::to_string(layers) + " width=" +
              std::to_string(width) + " batch=" + std::to_string(batch) + " registration=" + registration + ", " +
              std::to_string(rounds) + " rounds x " + std::to_string(f.timing.iters) + " iterations each",
          "rebuilt / static: hidden share " + fixed(share0 > 0 ? share1 / share0 : 0.0, 2) + "x, exposed wait " +
              fixed(variants[0].exposed > 0 ? variants[1].exposed / variants[0].exposed : 0.0, 2) + "x, step time " +
              fixed(variants[0].wall > 0 ? variants[1].wall / variants[0].wall : 0.0, 2) + "x"});
  }
  return correct ? 0 : 1;
}

int throughput(int argc, char** argv) {
  Flags f("throughput", TimingOptions{5, 50});
  f.cli.add("model", "lenet | resnet18", "lenet");
  f.cli.add("batch", "batch size per rank", "64");
  f.cli.add("plain", "1: no DDP at all (each rank trains alone: the compute-only ceiling)", "0");
  f.cli.add("broadcast-buffers", "0 | 1: DdpOptions::broadcast_buffers", "1");
  f.cli.add("grad-view", "0 | 1: DdpOptions::gradient_as_bucket_view", "0");
  f.parse(argc, argv);
  const std::string model_name = f.cli.choice("model", {"lenet", "resnet18"});
  const int64_t batch = f.cli.integer("batch", 1);
  const bool plain = f.cli.integer("plain", 0, 1) != 0;
  ddp::DdpOptions options;
  options.broadcast_buffers = f.cli.integer("broadcast-buffers", 0, 1) != 0;
  options.gradient_as_bucket_view = f.cli.integer("grad-view", 0, 1) != 0;
  auto pg = ddp::init_process_group();
  const Batch data = make_batch(model_name, batch);
  double seconds = 0, loss = 0;
  ddp::DdpStats stats;
  const auto run = [&](auto net) {
    if (plain) {
      pg->barrier();
      seconds = train_seconds(net, net->parameters(), data, f.timing, &loss);
      return;
    }
    ddp::DistributedDataParallel<decltype(net)> model(net, pg, options);
    pg->barrier();
    seconds = train_seconds(model, model.parameters(), data, f.timing, &loss);
    stats = model.stats();
  };
  if (model_name == "lenet") run(LeNet(LeNetOptions(1, 28)));
  else run(ResNet18(3, 10));
  auto t = torch::tensor({seconds, finite(loss) ? 0.0 : 1.0}, torch::kDouble);
  pg->allreduce(t, c10d::ReduceOp::MAX);
  const bool correct = t[1].item<double>() == 0;  // every rank's loss finite
  if (pg->rank() == 0) {
    Table table({"impl", "model", "world_size", "batch_per_rank", "threads", "samples_per_s", "forward_ms",
                 "backward_compute_ms", "communication_ms", "hidden_pct", "exposed_wait_ms", "buckets", "correct"});
    table.add_row();
    table.set("impl", plain ? "plain-no-ddp" : "ddp-cpp");
    table.set("model", model_name);
    table.set("world_size", std::to_string(pg->size()));
    table.set("batch_per_rank", std::to_string(batch));
    table.set("threads", std::to_string(torch::get_num_threads()));
    table.set("samples_per_s", static_cast<double>(pg->size() * batch * f.timing.iters) / t[0].item<double>(), 1);
    table.set("forward_ms", stats.forward_ms, 2);
    table.set("backward_compute_ms", stats.backward_compute_ms, 2);
    table.set("communication_ms", stats.communication_ms, 2);
    table.set("hidden_pct", 100.0 * stats.hidden_share(), 0);
    table.set("exposed_wait_ms", stats.exposed_wait_ms, 2);
    table.set("buckets", std::to_string(stats.bucket_bytes.size()));
    table.set("correct", ok(correct));
    emit(table, f.output, {{"scenario", "throughput"}},
         {"throughput: " + std::to_string(f.timing.iters) + " timed steps after " + std::to_string(f.timing.warmup) +
          " warm-up steps; samples/s of the slowest rank; per-iteration times from DDP's stats()"});
  }
  return correct ? 0 : 1;
}

int run(int argc, char** argv) {
  if (argc < 2) throw ddp::UsageError("usage: ddp_micro_bench <overhead|buckets|overlap|throughput> [--flag value ...]");
  const std::string scenario = argv[1];
  // The scenario's flags follow its name: argv[1] becomes the program name of its command line.
  if (scenario == "overhead") return overhead(argc - 1, argv + 1);
  if (scenario == "buckets") return buckets(argc - 1, argv + 1);
  if (scenario == "overlap") return overlap(argc - 1, argv + 1);
  if (scenario == "throughput") return throughput(argc - 1, argv + 1);
  throw ddp::UsageError("unknown benchmark '" + scenario + "' (overhead, buckets, overlap or throughput)");
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main(argc, argv, [](int c, char** v) { return with_usage("ddp_micro_bench", [&] { return run(c, v); }); });
}
