#include "examples/train_common.h"

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <thread>

#include "ddp/base/worker_variable_names.h"
#include "ddp/runtime/agent_channel.h"
#include "ddp/amp/autocast.h"
#include "ddp/amp/grad_scaler.h"
#include "ddp/checkpoint/checkpoint.h"
#include "examples/stop_signal.h"
#include "ddp/parallel/data_parallel.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/algorithms/comm_hook_state.h"
#include "ddp/algorithms/diloco.h"
#include "ddp/algorithms/model_averaging.h"
#include "ddp/algorithms/powersgd.h"
#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "examples/data/cifar10.h"
#include "examples/data/fashion_mnist.h"
#include "examples/data/image_dataset.h"
#include "examples/batch_policy.h"
#include "examples/live_training.h"
#include "examples/metrics.h"
#include "examples/models/lenet.h"
#include "examples/models/resnet.h"
#include "examples/progress.h"
#include "examples/sample_log.h"
#include "samplers/distributed_sampler.h"
#include "samplers/reshard.h"

namespace ddp::examples {
namespace {

using data::ImageDataset;
using Clock = std::chrono::steady_clock;

// Where this process stands: its rank among the processes and the device it computes on.
struct Runtime {
  int rank = 0;
  int world_size = 1;
  int local_size = 1;  // processes on this node
  torch::Device device = torch::kCPU;
  std::vector<torch::Device> devices;  // what the model runs on: several in dp
  std::string backend = "none";
  std::shared_ptr<ProcessGroup> group;  // ddp only
  std::unique_ptr<LiveTraining> live;   // ddp under ddp_launch --recovery live (See Note [Live training])
  bool main() const { return rank == 0; }
};

Runtime make_runtime(const TrainOptions& options) {
  Runtime rt;
  if ((rt.live = live_training_from_environment(options))) {
    // A group of this process alone until ft->start(); on_new_group sets rank and size then.
    rt.group = rt.live->ft->group();
    rt.rank = rt.live->launcher_rank;
    rt.world_size = rt.live->launcher_world_size;
    rt.local_size = rt.live->local_world_size;
    rt.device = rt.group->device();
    rt.devices = {rt.device};
    rt.backend = rt.group->backend_name();
    return rt;
  }
  switch (options.mode) {
    case Mode::kSingle:
      rt.device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
      rt.devices = {rt.device};
      break;
    case Mode::kDp:
      rt.devices = options.dp_replicas > 0 ? cpu_replicas(options.dp_replicas) : visible_devices();
      rt.device = rt.devices.front();
      break;
    case Mode::kDdp:
      // Rank, world size and rendez-vous from the environment ddp_launch sets (env://).
      rt.group = init_process_group();
      rt.rank = rt.group->rank();
      rt.world_size = rt.group->size();
      rt.local_size = rt.group->local_size();
      rt.device = rt.group->device();
      rt.devices = {rt.device};
      rt.backend = rt.group->backend_name();
      break;
  }
  return rt;
}

struct DataSets {
  std::unique_ptr<ImageDataset> train, test;
  int64_t train_size = 0, test_size = 0;
  int64_t channels = 0, image_size = 0;
};

DataSets load_data(const ProgramSpec& spec, const TrainOptions& options) {
  data::ImageSet train, test;
  data::Normalization normalization;
  data::AugmentOptions augment;
  if (spec.dataset == "fashion-mnist") {
    train = data::load_fashion_mnist(options.data_dir, data::Split::kTrain);
    test = data::load_fashion_mnist(options.data_dir, data::Split::kTest);
    normalization = data::fashion_mnist_normalization();
  } else {
    train = data::load_cifar10(options.data_dir, data::Split::kTrain);
    test = data::load_cifar10(options.data_dir, data::Split::kTest);
    normalization = data::cifar10_normalization();
    // The usual CIFAR recipe: random horizontal flip and random 32x32 crop of the image padded by 4.
    augment.flip = true;
    augment.crop_padding = 4;
    augment.seed = options.seed;
  }
  train.truncate(options.limit);
  test.truncate(options.limit);
  DataSets sets;
  sets.train_size = train.count;
  sets.test_size = test.count;
  sets.channels = train.channels;
  sets.image_size = train.height;
  sets.train = std::make_unique<ImageDataset>(train, normalization, augment);
  sets.test = std::make_unique<ImageDataset>(test, normalization);
  return sets;
}

// Note [Data order]
// ~~~~~~~~~~~~~~~~~
// Every mode draws its order from a DistributedSampler: one seeded permutation per epoch, rank r of R
// taking positions r, r + R, r + 2R, ... single and dp use it with one replica. So the DDP step s on
// R ranks with batch B covers exactly the samples of step s of a single run with batch R*B, and both
// runs compute the same gradient (the mean over the same R*B samples).
samplers::DistributedSampler make_sampler(int64_t size, const Runtime& rt, uint64_t seed) {
  samplers::DistributedSamplerOptions sampler_options(rt.world_size, rt.rank);
  sampler_options.seed = seed;
  return samplers::DistributedSampler(size, sampler_options);
}

// The model as the training loop sees it, whichever the mode.
struct Trainee {
  std::shared_ptr<torch::nn::Module> module;  // the parameters the optimizer steps
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  // Forward for evaluation. In ddp each rank evaluates its own share of the test set, possibly a
  // different number of batches, so this must not be DDP's forward (it may communicate).
  std::function<torch::Tensor(const torch::Tensor&)> evaluate;
  // A guard that suspends gradient synchronisation while it lives (ddp); empty in the other modes.
  std::function<std::shared_ptr<void>()> no_sync;
  // The registered communication hook (ddp, --comm-hook other than allreduce); its state goes with
  // the checkpoints (ddp/algorithms/comm_hook_state.h).
  std::shared_ptr<CommHookInterface> comm_hook;
};

template <class Holder>
Trainee wrap(Holder model, const TrainOptions& options, const Runtime& rt) {
  Trainee t;
  t.module = model.ptr();
  if (options.mode == Mode::kDp) {
    DataParallelOptions dp_options{rt.devices, {}};
    // CPU replicas share the process's intra-op threads (see Note [CPU replicas] in data_parallel.h).
    if (options.dp_replicas > 0) {
      dp_options.replica_threads = std::max(1, torch::get_num_threads() / static_cast<int>(options.dp_replicas));
    }
    auto dp = std::make_shared<DataParallel<Holder>>(model, dp_options);
    t.forward = [dp](const torch::Tensor& x) { return dp->forward(x); };
    t.evaluate = t.forward;
  } else if (options.mode == Mode::kDdp) {
    model->to(rt.device);
    // --diloco: no gradient and no buffer leaves the rank in a step; DiLoCo averages the parameters.
    DdpOptions ddp_options;
    ddp_options.broadcast_buffers = options.diloco == 0;
    auto ddp = std::make_shared<DistributedDataParallel<Holder>>(model, rt.group, ddp_options);
    if (options.diloco > 0) {
      ddp->register_comm_hook(std::make_shared<PostLocalSgdHook>(PostLocalSgdOptions{}));
    } else if (options.comm_hook != "allreduce") {
      PowerSgdOptions powersgd;
      powersgd.matrix_approximation_rank = options.powersgd_rank;
      powersgd.start_powersgd_iter = options.powersgd_start_iter;
      t.comm_hook = make_comm_hook(options.comm_hook, powersgd);
      ddp->register_comm_hook(t.comm_hook);
    }
    if (rt.live) rt.live->ft->track(*ddp);
    t.forward = [ddp](const torch::Tensor& x) { return ddp->forward(x); };
    t.no_sync = [ddp] { return std::shared_ptr<void>(std::make_shared<NoSyncGuard>(ddp->no_sync())); };
    t.evaluate = [model](const torch::Tensor& x) mutable { return model->forward(x); };
  } else {
    model->to(rt.device);
    t.forward = [model](const torch::Tensor& x) mutable { return model->forward(x); };
    t.evaluate = t.forward;
  }
  return t;
}

Trainee make_trainee(const TrainOptions& options, const DataSets& sets, const Runtime& rt) {
  // The same seed on every rank gives every replica the same initial weights.
  torch::manual_seed(options.seed);
  if (options.model == "resnet18") return wrap(models::ResNet18(sets.channels, 10), options, rt);
  return wrap(models::LeNet(models::LeNetOptions(sets.channels, sets.image_size)), options, rt);
}

// Element-wise sums over the ranks (the values themselves outside ddp).
std::vector<double> sum_over_ranks(std::vector<double> values, const Runtime& rt) {
  if (!rt.group) return values;
  torch::Tensor t = torch::tensor(values, torch::kFloat64);
  rt.group->allreduce(t);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

// Top-1 accuracy on the test set (this rank's share of it in ddp, summed over the ranks).
double evaluate(Trainee& trainee, ImageDataset& test, int64_t test_size, int64_t batch_size, const Runtime& rt) {
  torch::NoGradGuard no_grad;
  trainee.module->eval();
  int64_t correct = 0, total = 0;
  std::vector<size_t> rows;
  for (int64_t i = rt.rank; i < test_size; i += rt.world_size) rows.push_back(static_cast<size_t>(i));
  for (size_t start = 0; start < rows.size(); start += static_cast<size_t>(batch_size)) {
    const size_t end = std::min(rows.size(), start + static_cast<size_t>(batch_size));
    auto batch = test.get_batch(c10::ArrayRef<size_t>(rows.data() + start, end - start));
    const torch::Tensor predicted = trainee.evaluate(batch.data.to(rt.device)).argmax(1).cpu();
    correct += predicted.eq(batch.target).sum().item<int64_t>();
    total += batch.target.size(0);
  }
  trainee.module->train();
  const std::vector<double> sums = sum_over_ranks({static_cast<double>(correct), static_cast<double>(total)}, rt);
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

// --save-params: every parameter as float32, concatenated in registration order, native byte order.
// A debug format for the tests, which compare runs without LibTorch.
void save_parameters(const torch::nn::Module& module, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const auto& p : module.parameters()) {
    const torch::Tensor values = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    out.write(reinterpret_cast<const char*>(values.data_ptr<float>()),
              static_cast<std::streamsize>(values.numel() * sizeof(float)));
  }
  if (!out) throw IoError(str(path, ": cannot write the parameters"));
}

std::string percent(double fraction) { return str(static_cast<double>(static_cast<int64_t>(fraction * 10000 + 0.5)) / 100, "%"); }

// Note [Intra-op threads]
// ~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch starts one intra-op thread per core in every process. With several processes per node,
// or other work on the machine, the threads of small models oversubscribe the cores and a step gets
// many times slower. Unless told otherwise (--threads, OMP_NUM_THREADS) each process takes its share.
void set_threads(const TrainOptions& options, int local_processes) {
  if (options.threads > 0) {
    torch::set_num_threads(static_cast<int>(options.threads));
  } else if (std::getenv(env::kOmpNumThreads) == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    torch::set_num_threads(std::max(1, cores / std::max(1, local_processes)));
  }
}

// --resume: the newest valid checkpoint under --checkpoint-dir. Every step folder skipped on the way
// (corrupt, cut, another user's, or without MANIFEST) is named in a warning with the reason. When
// checkpoints exist but none is valid the run stops with an error, since starting from scratch would
// silently throw the training away, unless --allow-fresh-start. nullopt: start from scratch.
std::optional<CheckpointInfo> checkpoint_to_resume(const TrainOptions& options, bool main) {
  const std::vector<CheckpointCandidate> candidates =
      inspect_checkpoints(options.checkpoint_dir, /*stop_at_first_valid=*/true);
  for (const auto& candidate : candidates) {
    if (candidate.valid) return candidate.info;
    if (main) std::cerr << "warning: skipping " << candidate.problem << std::endl;
  }
  if (!candidates.empty() && !options.allow_fresh_start) {
    throw IoError(str("--resume: none of the ", candidates.size(), " checkpoint folders in ", options.checkpoint_dir,
                      " is valid (each is named above with the reason); pass --allow-fresh-start to train from "
                      "scratch anyway"));
  }
  return std::nullopt;
}

// --diloco: its outer state beside the model, written by rank 0 (the same on every rank).
const char* const kDiLoCoStateFile = "diloco.pt";

// --diloco: the ranks' parameters made equal (an outer step over what is left) before they are
// evaluated or saved. Not in a live job, whose collectives belong in FaultTolerant's steps: there
// each rank evaluates its own parameters, and a checkpoint holds rank 0's with the outer state.
void finish_outer_steps(DiLoCo* diloco, const Runtime& rt) {
  if (diloco != nullptr && !rt.live) diloco->finish();
}

// --diloco: each rank's inner SGD momentum is its own (its gradients are not averaged), while the
// checkpoint's optimizer state is rank 0's; so every rank also writes its momentum buffers.
std::filesystem::path inner_state_file(const std::filesystem::path& checkpoint, int rank) {
  return checkpoint / str("diloco-inner-rank", rank, ".pt");
}

void save_inner_state(torch::optim::Optimizer& inner, const std::filesystem::path& checkpoint, int rank) {
  StateDict buffers;
  int64_t index = 0;
  for (const auto& group : inner.param_groups()) {
    for (const auto& p : group.params()) {
      const auto found = inner.state().find(p.unsafeGetTensorImpl());
      if (found != inner.state().end()) {
        const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*found->second);
        buffers.insert(str(index), sgd.momentum_buffer().cpu());
      }
      ++index;
    }
  }
  save_state_dict(buffers, inner_state_file(checkpoint, rank));
}

// False when the checkpoint has no file for this rank (fewer ranks saved it): rank 0's momentum stays.
bool load_inner_state(torch::optim::Optimizer& inner, const std::filesystem::path& checkpoint, int rank) {
  const auto file = inner_state_file(checkpoint, rank);
  if (!std::filesystem::exists(file)) return false;
  const StateDict buffers = load_state_dict_file(file);
  int64_t index = 0;
  for (const auto& group : inner.param_groups()) {
    for (const auto& p : group.params()) {
      if (const torch::Tensor* buffer = buffers.find(str(index++))) {
        auto state = std::make_unique<torch::optim::SGDParamState>();
        state->momentum_buffer(buffer->to(p.device()));
        inner.state()[p.unsafeGetTensorImpl()] = std::move(state);
      }
    }
  }
  return true;
}

// --diloco: DiLoCo over `inner`, with the outer state of the checkpoint being resumed (if any).
std::unique_ptr<DiLoCo> make_diloco(const TrainOptions& options, const Runtime& rt, torch::optim::Optimizer& inner,
                                    const std::filesystem::path& resumed) {
  DiLoCoOptions diloco_options;
  diloco_options.sync_every = options.diloco;
  diloco_options.fragments = options.diloco_fragments;
  diloco_options.sync_delay = options.diloco_delay;
  diloco_options.outer_lr = options.outer_lr;
  diloco_options.outer_momentum = options.outer_momentum;
  diloco_options.outer_dtype = parse_outer_dtype(options.outer_dtype);
  auto diloco = std::make_unique<DiLoCo>(rt.group, inner, diloco_options);
  if (resumed.empty()) return diloco;
  if (!load_inner_state(inner, resumed, rt.rank) && rt.rank > 0) {
    std::cerr << "warning: rank " << rt.rank << ": " << resumed.string() << " holds no inner momentum of this rank: "
              << "it starts from rank 0's" << std::endl;
  }
  if (std::filesystem::exists(resumed / kDiLoCoStateFile)) {
    diloco->load_state(load_state_dict_file(resumed / kDiLoCoStateFile));
  } else if (rt.main()) {  // saved without --diloco, or cut before rank 0 wrote the state
    std::cerr << "warning: " << resumed.string() << " holds no " << kDiLoCoStateFile
              << ": the outer optimizer starts afresh from its parameters" << std::endl;
  }
  return diloco;
}

// Writes a checkpoint through the library: rank 0 writes, every rank waits for it.
void save(const TrainOptions& options, const Runtime& rt, Trainee& trainee, torch::optim::Optimizer& optimizer,
          DiLoCo* diloco, const amp::GradScaler& scaler, int64_t step, const samplers::SamplerState& sampler_state) {
  finish_outer_steps(diloco, rt);
  // --zero: every rank sends its shard of the optimizer state to rank 0, which writes it whole.
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer)) zero->consolidate_state_dict(0);
  TrainingProgress progress;
  if (scaler.is_enabled()) progress.grad_scaler = scaler.state_dict();
  progress.epoch = sampler_state.epoch;
  progress.step = step;
  progress.sampler = sampler_state;
  if (rt.group) {
    const auto folder = save_checkpoint(options.checkpoint_dir, *trainee.module, &optimizer, progress, *rt.group);
    if (trainee.comm_hook) {
      try {
        save_comm_hook_state(*trainee.comm_hook, folder, rt.group->rank());
      } catch (const IoError& error) {  // e.g. hosts without a shared file system: train on
        std::cerr << "warning: the communication hook's state is not in the checkpoint: " << error.what() << std::endl;
      }
    }
    if (diloco != nullptr) {
      try {
        if (rt.main()) save_state_dict(diloco->state(), folder / kDiLoCoStateFile);
        save_inner_state(optimizer, folder, rt.rank);
      } catch (const IoError& error) {  // as the hook's state above
        std::cerr << "warning: rank " << rt.rank << ": DiLoCo's state is not in the checkpoint: " << error.what()
                  << std::endl;
      }
    }
  } else {
    save_checkpoint(options.checkpoint_dir, *trainee.module, &optimizer, progress, 0, [] {});
  }
}

// SGD, or with --zero SGD sharded over the ranks (the same updates, 1/W of the momentum per rank).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& options, const Trainee& trainee,
                                                        const Runtime& rt) {
  const auto sgd = torch::optim::SGDOptions(options.lr).momentum(options.momentum).weight_decay(options.weight_decay);
  if (options.zero) return ZeroRedundancyOptimizer::of<torch::optim::SGD>(trainee.module->parameters(), sgd, rt.group);
  return std::make_unique<torch::optim::SGD>(trainee.module->parameters(), sgd);
}

RunMetrics start_metrics(const ProgramSpec& spec, const TrainOptions& options, const Runtime& rt, const DataSets& sets,
                         int64_t batch_size) {
  RunMetrics metrics;
  metrics.program = spec.name;
  metrics.model = options.model;
  metrics.mode = mode_name(options.mode);
  metrics.backend = rt.backend;
  metrics.world_size = rt.world_size;
  for (const auto& d : rt.devices) metrics.devices.push_back(d.str());
  metrics.batch_size = batch_size;
  metrics.global_batch_size = batch_size * options.grad_accum * rt.world_size;
  metrics.grad_accum = options.grad_accum;
  metrics.train_samples = sets.train_size;
  metrics.test_samples = sets.test_size;
  metrics.epochs = options.epochs;
  return metrics;
}

// Optimizer steps for `samples` of this rank at micro-batch batch_size: the last micro-batch and the
// last group of --grad-accum micro-batches may be short.
int64_t steps_for(int64_t samples, int64_t batch_size, int64_t grad_accum) {
  const int64_t micro_batches = (samples + batch_size - 1) / batch_size;
  return (micro_batches + grad_accum - 1) / grad_accum;
}

// Every rank says so when it resumes an epoch at another world size than the checkpoint's; offset: where
// its share of the rest of the epoch starts.
void report_world_change(const samplers::SamplerState& saved, int64_t offset, int64_t dataset_size,
                         const Runtime& rt) {
  if (saved.num_replicas == rt.world_size) return;
  std::cout << "rank " << rt.rank << ": resumed epoch " << saved.epoch + 1 << " at sample offset " << offset
            << " of " << dataset_size << ", world size " << saved.num_replicas << " -> " << rt.world_size
            << std::endl;
}

// --log-samples: the samples of micro-batch `micro` of this rank's share (the loader hands them out in
// the share's order).
void log_micro_batch(SampleLog& log, int64_t epoch, const std::vector<int64_t>& share, int64_t micro,
                     int64_t batch_size) {
  if (!log.enabled()) return;
  const auto size = static_cast<int64_t>(share.size());
  const int64_t first = std::min(size, micro * batch_size), last = std::min(size, first + batch_size);
  log.write(epoch, std::vector<int64_t>(share.begin() + first, share.begin() + last));
}

int train(const ProgramSpec& spec, const TrainOptions& options) {
  // Installed first, before the rendezvous and the data: Slurm signals every process of the step at
  // once, and a rank still setting up must not die of the signal (its default action) while the
  // others already train; one that arrives during set-up stops the run at its first step. See
  // Note [Checkpoint on a signal].
  std::optional<examples::StopSignal> stop_signal;
  if (!options.checkpoint_on_signal.empty()) stop_signal.emplace(options.checkpoint_on_signal);
  Runtime rt = make_runtime(options);
  // Each rank's micro-batch at this world size (See Note [Batch policy]); checked before the data loads.
  int64_t batch_size = per_rank_batch_size(options, rt.world_size);
  set_threads(options, rt.local_size);
  DataSets sets = load_data(spec, options);
  Trainee trainee = make_trainee(options, sets, rt);
  const std::unique_ptr<torch::optim::Optimizer> optimizer_holder = make_optimizer(options, trainee, rt);
  torch::optim::Optimizer& optimizer = *optimizer_holder;
  // --amp fp16 scales the loss; bf16 has float32's range and needs no scaling (as in PyTorch).
  amp::GradScalerOptions scaler_options;
  scaler_options.enabled = options.amp == amp::Precision::kFloat16;
  amp::GradScaler scaler(rt.device, scaler_options);
  std::unique_ptr<DiLoCo> diloco;  // made after --resume loads the parameters: its global copy

  // --resume: model, optimizer (momentum), step, sampler epoch and position, RNG state. A worker joining
  // a live job receives them from a survivor instead (See Note [Live training]).
  int64_t epoch = 0, global_step = 0;
  std::optional<samplers::SamplerState> resumed;
  if (options.resume && !(rt.live && rt.live->job.joining)) {
    if (const auto latest = checkpoint_to_resume(options, rt.main())) {
      const TrainingProgress progress = load_checkpoint(latest->path, *trainee.module, &optimizer);
      if (trainee.comm_hook && rt.group && load_comm_hook_state(*trainee.comm_hook, latest->path, rt.rank)) {
        if (rt.main()) std::cout << "resuming the communication hook's state" << std::endl;
      }
      if (options.diloco > 0) diloco = make_diloco(options, rt, optimizer, latest->path);
      global_step = progress.step;
      if (progress.grad_scaler && scaler.is_enabled()) scaler.load_state_dict(*progress.grad_scaler);
      epoch = progress.sampler.epoch;
      resumed = progress.sampler;
      if (rt.main()) std::cout << "resuming from " << latest->path.string() << " (epoch " << epoch + 1
                               << ", step " << global_step << ")" << std::endl;
    } else if (rt.main()) {
      std::cout << "no valid checkpoint in " << options.checkpoint_dir << ": starting from scratch" << std::endl;
    }
  }
  if (options.diloco > 0 && !diloco) diloco = make_diloco(options, rt, optimizer, {});
  // Live: the samples of the epoch that the applied steps consumed, all ranks together (exact).
  int64_t epoch_offset = 0;
  if (rt.live) {
    if (resumed) epoch_offset = samplers::global_offset(*resumed, sets.train_size, /*drop_last=*/false);
    FaultTolerant& ft = *rt.live->ft;
    ft.track(optimizer);
    if (diloco) ft.track(*diloco);
    if (scaler.is_enabled()) ft.track(scaler);
    ft.track("epoch", epoch);
    ft.track("epoch offset", epoch_offset);
    ft.track("global step", global_step);
    rt.live->on_new_group = [&rt](ProcessGroup& group, const Membership& membership) {
      rt.group = rt.live->ft->group();
      rt.rank = group.rank();
      rt.world_size = group.size();
      std::cout << "rank " << rt.rank << ": live recovery round " << membership.round << ", world size "
                << rt.world_size << ", pid " << ::getpid() << std::endl;
    };
    if (!ft.start()) {  // joins the job; a joiner (a claimed spare too) receives the state here
      std::cout << "a spare (ddp_launch --spares) that the job did not need: released, pid " << ::getpid() << std::endl;
      return 0;
    }
    rt.live->regrouped = false;
    batch_size = per_rank_batch_size(options, rt.world_size);
    resumed = samplers::SamplerState(epoch, 0, rt.world_size, epoch_offset);
  }
  samplers::DistributedSampler sampler = make_sampler(sets.train_size, rt, options.seed);
  RunMetrics metrics = start_metrics(spec, options, rt, sets, batch_size);
  // Steps of a whole epoch; an epoch resumed at another world size has its own (its share's).
  const int64_t steps_per_epoch = steps_for(sampler.size(), batch_size, options.grad_accum);
  int64_t samples_per_micro_batch = batch_size * rt.world_size;
  SampleLog sample_log(options.log_samples, rt.world_size, rt.rank);

  const bool terminal = is_terminal(STDOUT_FILENO);
  if (rt.main()) {
    std::cout << spec.name << ": " << options.model << " on " << sets.train_size << " training samples, mode "
              << metrics.mode << ", " << rt.world_size << " process(es), device(s) " << join(metrics.devices, ",")
              << ", " << metrics.global_batch_size << " samples per step, " << steps_per_epoch << " steps per epoch"
              << ", amp " << amp::precision_name(options.amp) << std::endl;
  }

  double train_seconds = 0;
  int64_t trained_samples = 0;
  ddp::ProgressReporter to_launcher;
  bool stopped = false;  // --max-steps reached
  while (epoch < options.epochs && !stopped) {
    const auto epoch_start = Clock::now();
    sets.train->set_epoch(epoch);
    int64_t micro = 0;  // micro-batches of this epoch's share done so far, on this rank
    if (resumed && resumed->epoch == epoch) {
      // Mid-epoch: the loader starts after the consumed samples; at another world size with the rest of
      // the epoch split among this world's ranks (See Note [Re-sharding at a new world size]).
      sampler.set_state(*resumed);
      micro = sampler.position() / batch_size;
    } else {
      sampler.set_epoch(epoch);
    }
    // This rank's samples of the epoch: all of its share, or the rest of the epoch's after a re-shard.
    const std::vector<int64_t> share = sampler.indices();
    const int64_t share_start = sampler.state(0).offset.value_or(0);
    if (resumed && resumed->epoch == epoch) report_world_change(*resumed, share_start, sets.train_size, rt);
    const int64_t micro_batches = (static_cast<int64_t>(share.size()) + batch_size - 1) / batch_size;
    const int64_t epoch_steps = steps_for(static_cast<int64_t>(share.size()), batch_size, options.grad_accum);
    auto loader = torch::data::make_data_loader(
        *sets.train, sampler,
        torch::data::DataLoaderOptions().batch_size(static_cast<size_t>(batch_size))
            .workers(static_cast<size_t>(options.workers)));
    std::optional<ProgressLine> progress;
    if (rt.main()) {
      progress.emplace(std::cout, terminal, str("epoch ", epoch + 1, "/", options.epochs), epoch_steps,
                       metrics.global_batch_size);
    }
    trainee.module->train();
    double loss_sum = 0;
    int64_t loss_count = 0;
    auto batches = loader->begin();
    while (micro < micro_batches) {
      if (options.max_steps > 0 && global_step >= options.max_steps) {
        stopped = true;  // mid-epoch: no epoch-end checkpoint
        break;
      }
      // The micro-batches of one optimizer step; the last group of an epoch may be shorter.
      const int64_t group_start = micro - micro % options.grad_accum;
      const int64_t group_size = std::min(options.grad_accum, micro_batches - group_start);
      const int64_t step_end = group_start + group_size;
      double step_loss = 0;
      // Forward and backward of the step's micro-batches: DDP synchronises the gradients in the last.
      const auto compute = [&] {
        die_or_wait_for_test(options, rt.live.get(), rt.rank, rt.world_size, global_step);
        // Live: the exchanges due after the last inner step (See Note [DiLoCo under FaultTolerant]).
        if (diloco && rt.live) diloco->synchronize();
        optimizer.zero_grad();
        step_loss = 0;
        for (int64_t m = micro; m < step_end; ++m, ++batches) {
          auto& batch = *batches;
          std::shared_ptr<void> guard;
          if (m + 1 < step_end && trainee.no_sync) guard = trainee.no_sync();
          torch::Tensor loss;
          {
            amp::AutocastScope autocast(rt.device.type(), options.amp);
            const torch::Tensor output = trainee.forward(batch.data.to(rt.device));
            loss = torch::nn::functional::cross_entropy(output, batch.target.to(output.device()));
          }
          scaler.scale(loss / static_cast<double>(group_size)).backward();
          step_loss += loss.item<double>();
        }
      };
      const auto apply = [&] {
        for (auto& group : optimizer.param_groups()) {  // --zero: the wrapper passes them on
          static_cast<torch::optim::SGDOptions&>(group.options())
              .lr(scheduled_learning_rate(options, schedule_progress(epoch, options.epochs, share_start, sets.train_size,
                                                                     group_start / options.grad_accum, epoch_steps)));
        }
        if (!diloco) {
          scaler.step(optimizer);  // optimizer.step() unless fp16 gradients overflowed
        } else if (rt.live) {
          diloco->inner_step();  // apply() does not communicate; synchronize() follows in compute()
        } else {
          diloco->step();
        }
        scaler.update();
        ++global_step;
        epoch_offset = *sampler.state(step_end * batch_size).offset;
      };
      if (rt.live) {
        if (!rt.live->ft->step(compute, apply)) break;  // dropped and regrouped: the epoch goes on re-sharded
      } else {
        compute();
        apply();
      }
      for (int64_t m = micro; m < step_end; ++m) log_micro_batch(sample_log, epoch, share, m, batch_size);
      loss_sum += step_loss;
      loss_count += step_end - micro;
      trained_samples += (step_end - micro) * samples_per_micro_batch;
      micro = step_end;
      if (progress) progress->update(micro / options.grad_accum, loss_sum / static_cast<double>(loss_count));
      // This rank's samples and running loss to ddp_launch's metrics (a no-op without it).
      to_launcher.report(group_size * batch_size, loss_sum / static_cast<double>(loss_count));
      if (rt.live && rt.live->regrouped) break;  // a joiner was admitted: the next step is in a new share
      const bool last = micro == micro_batches;
      if (!options.checkpoint_dir.empty() && options.checkpoint_every > 0 && !last &&
          global_step % options.checkpoint_every == 0) {
        save(options, rt, trainee, optimizer, diloco.get(), scaler, global_step, sampler.state(micro * batch_size));
      }
      if (stop_signal && !last && stop_signal->requested(rt.group.get())) {
        save(options, rt, trainee, optimizer, diloco.get(), scaler, global_step, sampler.state(micro * batch_size));
        if (rt.main()) {
          std::cout << "signal " << stop_signal->name() << ": checkpoint of step " << global_step << " written to "
                    << options.checkpoint_dir << ", stopping (resume with --resume)" << std::endl;
        }
        stopped = true;
        break;
      }
    }
    if (progress) progress->finish();
    if (rt.live && rt.live->regrouped) {  // the rest of the epoch at the new world size (Note [Live training])
      rt.live->regrouped = false;
      batch_size = per_rank_batch_size(options, rt.world_size);
      samples_per_micro_batch = batch_size * rt.world_size;
      metrics.world_size = rt.world_size;
      metrics.global_batch_size = batch_size * options.grad_accum * rt.world_size;
      sampler = make_sampler(sets.train_size, rt, options.seed);
      resumed = samplers::SamplerState(epoch, 0, rt.world_size, epoch_offset);
      std::cout << "rank " << rt.rank << ": epoch " << epoch + 1 << " goes on at sample offset " << epoch_offset
                << " of " << sets.train_size << ", " << batch_size << " samples per rank and micro-batch" << std::endl;
      continue;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    train_seconds += seconds;
    if (!options.checkpoint_dir.empty() && !stopped) {
      save(options, rt, trainee, optimizer, diloco.get(), scaler, global_step, samplers::SamplerState{epoch + 1, 0, rt.world_size, 0});
    }
    finish_outer_steps(diloco.get(), rt);  // a no-op after the checkpoint's
    const double accuracy = evaluate(trainee, *sets.test, sets.test_size, std::max<int64_t>(batch_size, 256), rt);
    const std::vector<double> loss_sums = sum_over_ranks({loss_sum, static_cast<double>(loss_count)}, rt);
    const double mean_loss = loss_sums[1] > 0 ? loss_sums[0] / loss_sums[1] : 0.0;
    metrics.epoch_seconds.push_back(seconds);
    metrics.epoch_train_loss.push_back(mean_loss);
    metrics.epoch_test_accuracy.push_back(accuracy);
    if (rt.main()) {
      std::cout << "epoch " << epoch + 1 << "/" << options.epochs << ": train loss " << mean_loss
                << ", test accuracy " << percent(accuracy) << ", " << seconds << " s" << std::endl;
    }
    if (options.max_steps > 0 && global_step >= options.max_steps) stopped = true;
    ++epoch;
    epoch_offset = 0;
  }

  metrics.samples_per_second = train_seconds > 0 ? static_cast<double>(trained_samples) / train_seconds : 0.0;
  metrics.final_loss = metrics.epoch_train_loss.empty() ? 0.0 : metrics.epoch_train_loss.back();
  metrics.final_accuracy = metrics.epoch_test_accuracy.empty() ? 0.0 : metrics.epoch_test_accuracy.back();
  metrics.peak_memory_bytes = detail::peak_rss_bytes();
  metrics.peak_memory_kind = "rss";
  if (rt.live) {
    rt.live->ft->finish();  // the spares still waiting leave (See Note [Hot spares] in ddp/elastic/membership.h)
    std::cout << "rank " << rt.rank << ": live recovery finished at step " << global_step << ", world size "
              << rt.world_size << ", pid " << ::getpid() << ", parameters " << std::hex
              << parameters_checksum(*trainee.module) << std::dec << std::endl;
  }
  if (diloco && rt.main()) {
    std::cout << "DiLoCo: " << diloco->outer_steps() << " outer steps over " << diloco->inner_steps()
              << " inner steps, " << diloco->bytes_sent() << " bytes sent by rank 0" << std::endl;
  }
  if (rt.main()) {
    std::cout << "final test accuracy " << percent(metrics.final_accuracy) << " (" << metrics.samples_per_second
              << " samples/s, peak memory " << metrics.peak_memory_bytes / (1 << 20) << " MiB)" << std::endl;
    if (!options.metrics_json.empty()) write_metrics(metrics, options.metrics_json);
    if (!options.save_params.empty()) save_parameters(*trainee.module, options.save_params);
  }
  return 0;
}

}  // namespace

int train_main(int argc, char** argv, const ProgramSpec& spec) {
  std::optional<TrainOptions> options;
  try {
    options = parse_train_options(argc, argv, spec);
  } catch (const UsageError& e) {
    std::cerr << spec.name << ": error: " << e.what() << std::endl;
    return kUsageExitCode;
  }
  if (!options) return 0;
  // run_main prints any other error in one line and leaves it in ddp_launch's error file.
  return run_main(argc, argv, [&](int, char**) {
    try {
      return train(spec, *options);
    } catch (const InvalidArgument& e) {  // bad input found while setting up (data folder, checkpoint flags)
      std::cerr << spec.name << ": error: " << e.what() << std::endl;
      return kUsageExitCode;
    }
  });
}

}  // namespace ddp::examples
