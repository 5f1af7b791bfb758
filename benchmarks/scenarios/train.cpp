// Scenario "train": model x mode x batch size training steps, each configuration warm-up then timed
// iterations, with the step split into data, forward, backward compute, communication wait and
// optimizer. The models are the examples' (examples/models); the data is synthetic (see Note [Synthetic
// data]) or Fashion-MNIST through the examples' pipeline (see Note [Real data]).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/scenarios/runtime.h"
#include "benchmarks/scenarios/scenarios.h"
#include "benchmarks/scenarios/training_features.h"
#include "ddp/amp/autocast.h"
#include "ddp/amp/grad_scaler.h"
#include "ddp/parallel/data_parallel.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/algorithms/diloco.h"
#include "ddp/algorithms/model_averaging.h"
#include "ddp/algorithms/powersgd.h"
#include "examples/data/fashion_mnist.h"
#include "examples/data/image_dataset.h"
#include "examples/models/lenet.h"
#include "examples/models/resnet.h"
#include "samplers/distributed_sampler.h"

namespace ddp::bench {
namespace {

// Note [Synthetic data]
// ~~~~~~~~~~~~~~~~~~~~~
// Each configuration keeps --pool-batches batches of uint8 images in memory, shaped like the real sets
// (Fashion-MNIST 1x28x28 for lenet, CIFAR-10 3x32x32 for resnet18), and cycles through them. The
// "data" phase does what the examples' loader does per batch: slice, convert to float, normalise. The
// pixels are noise shifted by 12 grey levels per class, so the task is learnable and the loss column
// falls (a sanity check that training really happens), and no download is needed. Each rank draws its
// own batches (seed + rank), as a DistributedSampler would give it its own samples.
// Where a configuration's batches come from: next() gives the next (images, labels) on device.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual std::pair<torch::Tensor, torch::Tensor> next(torch::Device device) = 0;
};

struct SyntheticData : BatchSource {
  torch::Tensor images;  // uint8 [pool * batch, C, H, W]
  torch::Tensor labels;  // int64 [pool * batch]
  int64_t batch = 0, pool = 0;
  double mean = 0, stddev = 1;

  SyntheticData(const std::string& model, int64_t batch_, int64_t pool_, int rank) : batch(batch_), pool(pool_) {
    const bool cifar = model == "resnet18";
    const int64_t channels = cifar ? 3 : 1, side = cifar ? 32 : 28;
    torch::manual_seed(1000 + rank);
    labels = torch::randint(10, {pool * batch}, torch::kLong);
    images = (torch::randint(128, {pool * batch, channels, side, side}, torch::kLong) +
              labels.view({-1, 1, 1, 1}) * 12).to(torch::kUInt8);
    mean = cifar ? 0.4734 : 0.2860;
    stddev = cifar ? 0.2516 : 0.3530;
  }
  std::pair<torch::Tensor, torch::Tensor> next(torch::Device device) override {
    const int64_t start = (step++ % pool) * batch;
    torch::Tensor x = images.narrow(0, start, batch).to(device).to(torch::kFloat).div_(255.0).sub_(mean).div_(stddev);
    return {x, labels.narrow(0, start, batch).to(device)};
  }
  int64_t step = 0;
};

// Note [Real data]
// ~~~~~~~~~~~~~~~~
// --data fashion-mnist trains LeNet on Debian's dataset-fashion-mnist (--data-dir) exactly as
// examples/train_fashion_mnist feeds it: the examples' ImageDataset (uint8 in memory; per batch index,
// convert to float, scale, normalise) behind a DistributedSampler (rank r of the world takes its
// share of one seeded permutation per epoch) and LibTorch's data loader with no worker threads (the
// examples' default). The "data" phase is the time to take the next batch from the loader. A new
// epoch (set_epoch, new loader) starts when the sampler's share is used up.
using FashionLoader = torch::data::StatelessDataLoader<examples::data::ImageDataset, samplers::DistributedSampler>;
struct FashionMnistData : BatchSource {
  FashionMnistData(const examples::data::ImageSet& set, int64_t batch_, int world, int rank)
      : dataset(set, examples::data::fashion_mnist_normalization()),
        sampler(set.count, samplers::DistributedSamplerOptions(world, rank)),
        batch(batch_) {}
  std::pair<torch::Tensor, torch::Tensor> next(torch::Device device) override {
    if (!loader || *position == loader->end()) {
      position.reset();
      loader.reset();
      sampler.set_epoch(epoch++);
      loader = torch::data::make_data_loader(
          dataset, sampler, torch::data::DataLoaderOptions().batch_size(static_cast<size_t>(batch)).workers(0));
      position.emplace(loader->begin());
    }
    auto example = **position;
    ++*position;
    return {example.data.to(device), example.target.to(device)};
  }
  examples::data::ImageDataset dataset;
  samplers::DistributedSampler sampler;
  int64_t batch, epoch = 0;
  std::unique_ptr<FashionLoader> loader;
  std::optional<torch::data::Iterator<torch::data::Example<>>> position;
};

const std::vector<std::string> kColumns = {
    "model", "data", "mode", "world_size", "devices", "batch_per_rank", "global_batch", "threads", "warmup",
    "iters", "it_per_s", "samples_per_s", "step_ms_median", "step_ms_mean", "step_ms_stddev", "data_ms",
    "forward_ms", "backward_compute_ms", "comm_wait_ms", "optimizer_ms", "comm_ms", "comm_hidden_pct",
    "peak_mem_mib", "peak_mem_per_rank_mib", "peak_mem_kind", "scaling_eff", "final_loss", "ddp_options",
    "amp", "optimizer", "zero", "opt_state_mib_per_rank"};

struct Config {
  std::string model, mode;
  int64_t batch = 0;
};

struct Measurement {
  double elapsed_s = 0;           // timed iterations, slowest rank
  std::vector<double> step_ms;    // this rank's step times
  std::map<std::string, double> phase_ms;  // per timed iteration, this rank
  double comm_ms = 0, hidden_ms = 0;       // DDP's statistics over the timed iterations
  double final_loss = 0;
  int devices = 1;
  int64_t optimizer_state_bytes = 0;  // this rank's (its shard's with --zero)
};

// Runs warm-up + timed iterations of `forward` (the model in one of the modes).
template <class Forward>
Measurement train_loop(Forward&& forward, std::vector<torch::Tensor> parameters, BatchSource& data,
                       torch::Device device, const BenchOptions& options,
                       const std::function<DdpStats()>& ddp_stats,
                       const std::shared_ptr<ProcessGroup>& zero_group = nullptr) {
  const auto optimizer_holder = make_bench_optimizer(options, parameters, zero_group);
  torch::optim::Optimizer& optimizer = *optimizer_holder;
  const amp::Precision precision = amp::parse_precision(options.amp);
  amp::GradScalerOptions scaler_options;
  scaler_options.enabled = precision == amp::Precision::kFloat16;
  amp::GradScaler scaler(device, scaler_options);
  std::optional<DiLoCo> diloco;  // --diloco: its exchanges fall in the optimizer phase
  if (options.diloco > 0 && zero_group) {
    DiLoCoOptions diloco_options;
    diloco_options.sync_every = options.diloco;
    diloco_options.fragments = options.diloco_fragments;
    diloco_options.sync_delay = options.diloco_delay;
    diloco_options.outer_lr = options.outer_lr;
    diloco_options.outer_momentum = options.outer_momentum;
    diloco_options.outer_dtype = parse_outer_dtype(options.outer_dtype);
    diloco.emplace(zero_group, optimizer, diloco_options);
  }
  Measurement m;
  PhaseTimer timer;
  DdpStats before;
  torch::Tensor loss;
  std::chrono::steady_clock::time_point start;
  for (int64_t i = 0; i < options.warmup + options.iters; ++i) {
    if (i == options.warmup) {
      timer.clear();
      if (ddp_stats) before = ddp_stats();
      start = std::chrono::steady_clock::now();
    }
    timer.start();
    auto [x, y] = data.next(device);
    double step = timer.lap("data");
    {
      amp::AutocastScope autocast(device.type(), precision);
      loss = torch::nn::functional::cross_entropy(forward(x), y);
    }
    step += timer.lap("forward");
    scaler.scale(loss).backward();
    step += timer.lap("backward");
    if (diloco) {
      diloco->step();
    } else {
      scaler.step(optimizer);
    }
    scaler.update();
    optimizer.zero_grad();
    step += timer.lap("optimizer");
    if (i >= options.warmup) m.step_ms.push_back(step);
  }
  m.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double n = static_cast<double>(options.iters);
  for (const auto& [phase, total] : timer.totals_ms()) m.phase_ms[phase] = total / n;
  m.final_loss = loss.item<double>();
  m.optimizer_state_bytes = bench_optimizer_state_bytes(optimizer);
  if (ddp_stats) {
    // DdpStats are averages over all synchronised iterations: difference the sums.
    const DdpStats after = ddp_stats();
    const double count = static_cast<double>(after.iterations - before.iterations);
    const auto delta = [&](double DdpStats::*field) {
      return count > 0 ? (after.*field * after.iterations - before.*field * before.iterations) / count : 0.0;
    };
    const double exposed = delta(&DdpStats::exposed_wait_ms);
    m.phase_ms["comm_wait"] = exposed;
    m.phase_ms["backward"] -= exposed;  // backward's wall time = compute + exposed wait
    m.comm_ms = delta(&DdpStats::communication_ms);
    m.hidden_ms = delta(&DdpStats::hidden_communication_ms);
  }
  return m;
}

DdpOptions ddp_options(const BenchOptions& options) {
  DdpOptions ddp;
  ddp.bucket_cap_bytes = mebibytes(options.bucket_cap_mb);
  ddp.gradient_as_bucket_view = options.gradient_as_bucket_view;
  // --diloco and --comm-hook none: nothing leaves a rank in a step, buffers neither.
  ddp.broadcast_buffers = options.broadcast_buffers && options.diloco == 0 && options.comm_hook != "none";
  // The harness accepted only known names; powersgd is registered on the module (below).
  if (auto builtin = parse_comm_hook(options.comm_hook)) ddp.comm_hook = *builtin;
  ddp.algorithm = parse_collective_algorithm(options.algorithms.front());
  return ddp;
}

// The ddp_options column: what DDP ran with, so rows of different settings stay apart in one CSV.
std::string ddp_options_text(const BenchOptions& options) {
  std::ostringstream cap;
  cap << options.bucket_cap_mb;  // shortest form: 25, 0.05
  return "bucket_cap_mb=" + cap.str() +
         " gradient_as_bucket_view=" + (options.gradient_as_bucket_view ? "1" : "0") + " comm_hook=" +
         options.comm_hook + (options.comm_hook == "powersgd" ? str("(r=", options.powersgd_rank, ")") : std::string()) +
         " broadcast_buffers=" + (ddp_options(options).broadcast_buffers ? "1" : "0") +
         (options.diloco > 0 ? str(" diloco=", options.diloco, " fragments=", options.diloco_fragments, " delay=",
                                   options.diloco_delay, " outer_dtype=", options.outer_dtype)
                             : std::string()) +
         (options.algorithms.front() == "auto" ? "" : " algorithm=" + options.algorithms.front());
}

template <class Holder>
Measurement run_mode(Holder model, const Config& config, const std::shared_ptr<ProcessGroup>& group,
                     const BenchOptions& options, const examples::data::ImageSet* real_data) {
  const int rank = group->rank(), world = config.mode == "ddp" ? group->size() : 1;
  std::unique_ptr<BatchSource> data;
  if (real_data != nullptr) {
    data = std::make_unique<FashionMnistData>(*real_data, config.batch, world, config.mode == "ddp" ? rank : 0);
  } else {
    data = std::make_unique<SyntheticData>(config.model, config.batch, options.pool_batches, rank);
  }
  if (config.mode == "single") {
    const torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
    model->to(device);
    return train_loop([&](const torch::Tensor& x) { return model->forward(x); }, model->parameters(), *data, device,
                      options, nullptr);
  }
  if (config.mode == "dp") {
    DataParallel<Holder> dp(model, bench_dp_options(options));
    Measurement m = train_loop([&](const torch::Tensor& x) { return dp(x); }, dp.parameters(), *data,
                               dp.devices().front(), options, nullptr);
    m.devices = static_cast<int>(dp.devices().size());
    return m;
  }
  const torch::Device device = group->device();
  model->to(device);
  DistributedDataParallel<Holder> ddp_model(model, group, ddp_options(options));
  if (options.diloco > 0 || options.comm_hook == "none") {
    ddp_model.register_comm_hook(std::make_shared<PostLocalSgdHook>(PostLocalSgdOptions{}));  // local gradients
  } else if (options.comm_hook == "powersgd") {
    PowerSgdOptions powersgd;
    powersgd.matrix_approximation_rank = options.powersgd_rank;
    powersgd.start_powersgd_iter = options.powersgd_start_iter;
    ddp_model.register_comm_hook(make_comm_hook(options.comm_hook, powersgd));
  }
  group->barrier();
  return train_loop([&](const torch::Tensor& x) { return ddp_model(x); }, ddp_model.parameters(), *data, device,
                    options, [&] { return ddp_model.stats(); }, group);
}

}  // namespace

int run_train(const BenchOptions& options) {
  const auto group = bench_process_group();
  if (options.slice_bytes.front() != BenchOptions::kGroupsSliceBytes) {
    group->set_allreduce_slice_bytes(options.slice_bytes.front());
  }
  const int rank = group->rank(), world = group->size();
  const int threads = configure_threads(options.threads);
  const bool main_rank = rank == 0;
  const bool real = options.data == "fashion-mnist";
  std::optional<examples::data::ImageSet> real_data;
  if (real) {
    real_data = examples::data::load_fashion_mnist(options.data_dir, examples::data::Split::kTrain);
  }
  Table table(kColumns);
  std::map<std::string, double> single_rate;  // "model/batch" -> samples/s of mode single
  for (const auto& model_name : options.models) {
    for (int64_t batch : options.batch_sizes) {
      for (const auto& mode : options.modes) {
        if (mode != "ddp" && world > 1) {
          if (main_rank) std::cerr << "ddp_bench: skipping mode " << mode << " at world size " << world
                                   << " (one process: run it without the launcher)" << std::endl;
          continue;
        }
        const Config config{model_name, mode, batch};
        const torch::Device device = mode == "ddp"                  ? group->device()
                                     : torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0)
                                                                   : torch::Device(torch::kCPU);
        const std::string memory_kind = reset_peak_device_memory(device);
        torch::manual_seed(0);  // same initial weights in every mode
        const Measurement m =
            model_name == "lenet"
                ? run_mode(examples::models::LeNet(examples::models::LeNetOptions(1, 28)), config, group, options,
                           real_data ? &*real_data : nullptr)
                : run_mode(examples::models::ResNet18(3, 10), config, group, options, nullptr);
        const int ranks = mode == "ddp" ? world : 1;
        ProcessGroup* reduce_group = mode == "ddp" ? group.get() : nullptr;
        const double elapsed = reduce(reduce_group, m.elapsed_s, c10d::ReduceOp::MAX);
        const std::vector<double> peaks = gather(reduce_group, static_cast<double>(peak_device_memory(device)) / (1 << 20));
        std::string per_rank;
        for (double p : peaks) {  // appended in two steps: gcc 12 -std=c++20 -O3 misreads "" + string as -Wrestrict
          if (!per_rank.empty()) per_rank += ' ';
          per_rank += fixed(p, 1);
        }
        const double loss = reduce(reduce_group, m.final_loss, c10d::ReduceOp::SUM) / ranks;
        std::string opt_state_text;  // MiB per rank, in rank order
        for (double bytes : gather(reduce_group, static_cast<double>(m.optimizer_state_bytes))) {
          if (!opt_state_text.empty()) opt_state_text += ' ';
          opt_state_text += fixed(bytes / (1 << 20), 2);
        }
        const double samples_per_s = static_cast<double>(ranks * batch * options.iters) / elapsed;
        const std::string key = model_name + "/" + std::to_string(batch);
        if (mode == "single") single_rate[key] = samples_per_s;
        if (!main_rank) continue;
        const Summary steps = summarize(m.step_ms);
        const auto phase = [&](const char* name) {
          const auto it = m.phase_ms.find(name);
          return it == m.phase_ms.end() ? 0.0 : it->second;
        };
        table.add_row();
        table.set("model", model_name);
        table.set("data", options.data);
        table.set("mode", mode);
        table.set("world_size", std::to_string(ranks));
        table.set("devices", std::to_string(mode == "dp" ? m.devices : 1));
        table.set("batch_per_rank", std::to_string(batch));
        table.set("global_batch", std::to_string(ranks * batch));
        table.set("threads", std::to_string(threads));
        table.set("warmup", std::to_string(options.warmup));
        table.set("iters", std::to_string(options.iters));
        table.set("it_per_s", static_cast<double>(options.iters) / elapsed, 2);
        table.set("samples_per_s", samples_per_s, 1);
        table.set("step_ms_median", steps.median, 3);
        table.set("step_ms_mean", steps.mean, 3);
        table.set("step_ms_stddev", steps.stddev, 3);
        table.set("data_ms", phase("data"), 3);
        table.set("forward_ms", phase("forward"), 3);
        table.set("backward_compute_ms", phase("backward"), 3);
        table.set("comm_wait_ms", phase("comm_wait"), 3);
        table.set("optimizer_ms", phase("optimizer"), 3);
        table.set("comm_ms", m.comm_ms, 3);
        table.set("comm_hidden_pct", m.comm_ms > 0 ? 100.0 * m.hidden_ms / m.comm_ms : 0.0, 1);
        table.set("peak_mem_mib", *std::max_element(peaks.begin(), peaks.end()), 1);
        table.set("peak_mem_per_rank_mib", per_rank);
        table.set("peak_mem_kind", memory_kind);
        // Scaling efficiency: samples/s over (devices x samples/s of one device at the same per-device batch).
        const int devices_used = mode == "dp" ? m.devices : ranks;
        const auto base = single_rate.find(model_name + "/" + std::to_string(batch));
        const double one_device = options.baseline_samples_per_s > 0 ? options.baseline_samples_per_s
                                  : base != single_rate.end()       ? base->second
                                                                    : 0.0;
        table.set("scaling_eff", one_device > 0 ? fixed(samples_per_s / (devices_used * one_device), 3) : "");
        table.set("final_loss", loss, 4);
        table.set("ddp_options", mode == "ddp" ? ddp_options_text(options) : "");
        table.set("amp", options.amp);
        table.set("optimizer", options.optimizer);
        table.set("zero", mode == "ddp" && options.zero ? "1" : "0");
        table.set("opt_state_mib_per_rank", opt_state_text);
      }
    }
  }
  if (main_rank) {
    emit(table, options,
         {{"scenario", "train"}, {"world_size", std::to_string(world)}, {"backend", group->backend_name()},
          {"threads", std::to_string(threads)},
          {"data", real ? "fashion-mnist from " + options.data_dir + " (see Note [Real data])" : "synthetic (see Note [Synthetic data])"}},
         {"ddp_bench train: world " + std::to_string(world) + ", backend " + group->backend_name() + ", " +
              std::to_string(threads) + " threads/rank, " + options.data + " data; times in ms per step (means over the timed "
              "iterations), step_ms_median over steps; peak memory per rank in rank order",
          "scaling_eff = samples_per_s / (devices * samples/s of one device at the same per-device batch)"});
  }
  group->barrier();
  return 0;
}

}  // namespace ddp::bench
