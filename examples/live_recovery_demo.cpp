// Live recovery with ddp_launch: a small model trained under ddp::FaultTolerant, its membership from
// the launcher (ddp::live_job_from_environment). A lost host costs the survivors the step in flight,
// not their processes; a restarted worker heals from a survivor. See Note [Live recovery with
// ddp_launch] in launcher/agent/live_recovery.cpp.
//   ddp_launch --nnodes 2:3 --rdzv_endpoint host0:29400 --rdzv_id job --recovery live
//       build/bin/live_recovery_demo --steps 200   (one command line, on every host)
// It trains on a fixed data set (--samples, made from a fixed seed) through ddp::DistributedSampler,
// --batch samples per rank and step, re-sharded at every membership change. See Note [Live demo data].
// --step-ms M sleeps M ms in each step after its backward; --spin-ms C computes C ms of CPU time
// before its forward (a CPU quota on one host then makes its ranks stragglers: hosts.live_straggler).
// Prints "live demo: started pid P ...", one "live demo: step S world W at_ms T" per applied step
// (T: the wall clock, for the recovery figure), and at the end
// "live demo: finished S steps pid P params <FNV-1a of the parameters>" (equal on every rank).
// At each new group it prints "live demo: round R rank r world W epoch E offset O at step S" (S: the
// steps applied before it: the round's steps are S+1, S+2, ...).
// --log-samples PATH appends "samples step S epoch E rank R world W: i,j,..." to PATH.<pid> for every
// step this rank computes, before it computes it (written straight to the file: a record survives a
// SIGKILL that follows; a step whose agreement failed here may still be applied by a rank whose
// agreement completed, with this rank's gradient: See Note [Live recovery]);
// --params-out PATH writes the parameters, one value a line, to PATH.<pid>.
//   live_recovery_demo --reference 3:10,2:5,1:20 --params-out PATH [--log-samples PATH]
// (no launcher, one process) replays a membership schedule (world size 3 for 10 applied steps, then
// 2 for 5, ...) as the live job would train it: the same per-rank batches, the average of the per-rank
// gradients, the same re-sharding; it writes the parameters (and the records) to PATH
// (tests/hosts/live_matrix_test.sh compares them with the live run's).
// Under ddp_launch's restart-based elastic rounds (--recovery restart) with --checkpoint-dir DIR it
// trains the same way in a plain process group, rank 0 saving a checkpoint (the sampler's counters
// in it) every --checkpoint-every steps, each attempt resuming from the latest one at its own world
// size: its round line is "round A+1 ... at step S" (A: TORCHELASTIC_RESTART_COUNT, S: the step
// resumed), each step line ends with "attempt A", and the records go to PATH.<attempt>.<pid>
// (tests/hosts/chaos_test.sh keeps each step of the final lineage: that of the last attempt).
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "ddp/checkpoint/checkpoint.h"
#include "ddp/distributed/process_group.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/elastic/fault_tolerant.h"
#include "ddp/checkpoint/detail/state_bytes.h"
#include "ddp/elastic/live_job.h"
#include "ddp/runtime/run_main.h"
#include "samplers/distributed_sampler.h"

namespace {

constexpr const char* kFlags =
    "flags: --steps --step-ms --spin-ms --settle-ms --timeout-ms --samples --batch --hold-group-ms --params-out --reference "
    "--log-samples --checkpoint-dir --checkpoint-every";

struct Args {
  std::int64_t steps = 100;
  int step_ms = 0;       // extra time per step, so that a test can act mid-training
  int spin_ms = 0;       // CPU time per step before the forward: a CPU quota makes this rank a straggler
  int settle_ms = 2000;  // StoreMembershipOptions::settle_timeout
  int timeout_ms = 10000;  // each collective's bound: the detection bound of a silent host
  int samples = 96;      // the data set's size
  int batch = 4;         // samples per rank and step
  int hold_group_ms = 0;  // a pause once the first recovery's group is built, for a test to act during it
  std::string log_samples;
  std::string params_out;
  std::string checkpoint_dir;  // restart-based elastic: every attempt resumes from the latest checkpoint here
  int checkpoint_every = 5;
  // --reference: the world size of each applied step, as (world size, steps) runs.
  std::vector<std::pair<int, std::int64_t>> reference;
};

// Busy for `ms` of this thread's CPU time (not wall time: a slowed rank takes longer for the same work).
void spin_for_cpu_ms(int ms) {
  if (ms <= 0) return;
  const auto cpu_ns = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
  };
  const std::int64_t until = cpu_ns() + static_cast<std::int64_t>(ms) * 1000000;
  while (cpu_ns() < until) {
  }
}

std::vector<std::pair<int, std::int64_t>> parse_schedule(const std::string& text) {
  std::vector<std::pair<int, std::int64_t>> runs;
  std::stringstream in(text);
  std::string run;
  while (std::getline(in, run, ',')) {
    const auto colon = run.find(':');
    if (colon == std::string::npos) {
      throw ddp::UsageError("--reference: '" + run + "' is not WORLD:STEPS (e.g. --reference 3:10,2:5)");
    }
    runs.emplace_back(ddp::parse_int(run.substr(0, colon), "--reference world size", 1, 1 << 20),
                      ddp::parse_int(run.substr(colon + 1), "--reference steps", 1, 1 << 30));
  }
  if (runs.empty()) throw ddp::UsageError("--reference needs WORLD:STEPS[,WORLD:STEPS...] (e.g. 3:10,2:5)");
  return runs;
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw ddp::UsageError(flag + " needs a value (" + kFlags + ")");
    const std::string text = argv[++i];
    if (flag == "--log-samples") {
      args.log_samples = text;
      continue;
    }
    if (flag == "--params-out") {
      args.params_out = text;
      continue;
    }
    if (flag == "--checkpoint-dir") {
      args.checkpoint_dir = text;
      continue;
    }
    if (flag == "--reference") {
      args.reference = parse_schedule(text);
      continue;
    }
    const int value = ddp::parse_int(text, flag, 0, 1 << 30);
    if (flag == "--steps") {
      args.steps = value;
    } else if (flag == "--step-ms") {
      args.step_ms = value;
    } else if (flag == "--spin-ms") {
      args.spin_ms = value;
    } else if (flag == "--settle-ms") {
      args.settle_ms = value;
    } else if (flag == "--timeout-ms") {
      args.timeout_ms = value;
    } else if (flag == "--samples") {
      args.samples = value;
    } else if (flag == "--batch") {
      args.batch = value;
    } else if (flag == "--hold-group-ms") {
      args.hold_group_ms = value;
    } else if (flag == "--checkpoint-every") {
      args.checkpoint_every = value;
    } else {
      throw ddp::UsageError("unknown flag " + flag + " (" + kFlags + ")");
    }
  }
  if (args.settle_ms <= 0 || args.timeout_ms <= 0) throw ddp::UsageError("--settle-ms and --timeout-ms must be > 0");
  if (args.samples <= 0 || args.batch <= 0) throw ddp::UsageError("--samples and --batch must be > 0");
  if (args.checkpoint_every <= 0) throw ddp::UsageError("--checkpoint-every must be > 0");
  return args;
}

long long wall_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// Note [Live demo data]
// ~~~~~~~~~~~~~~~~~~~~~
// The data set is fixed (made from seed 7 on every rank), so that a reference run can train on the
// same batches. Where the job stands in it is one ddp::samplers::SamplerState, held as four counters
// that FaultTolerant tracks: a joiner receives them with the model. A step takes the next --batch of
// this rank's share; once the step is applied everywhere (apply()), the counters advance by what was
// trained, so a dropped step consumes nothing. At every new group (on_new_group) the sampler is made
// again at the group's rank and world size from the counters: at another world size the rest of the
// epoch from its exact global offset is split among the new ranks (See Note [Re-sharding at a new
// world size] in samplers/reshard.h), at the same one it goes on where it was. An epoch ends when
// its offset reaches the data set's size; the next starts at offset 0.
struct Progress {
  std::int64_t epoch = 0;
  std::int64_t position = 0;
  std::int64_t replicas = 1;
  std::int64_t offset = 0;
};

struct DataSet {
  torch::Tensor x;
  torch::Tensor y;
};

DataSet make_data(std::int64_t samples) {
  auto generator = at::detail::createCPUGenerator(7);
  DataSet data;
  data.x = at::randn({samples, 16}, generator);
  data.y = at::randn({samples, 4}, generator);
  return data;
}

// The sampler of `rank` in a world of `world`, at `progress` (which it normalizes: position 0 in a
// new share when the world size changed).
ddp::samplers::DistributedSampler shard(Progress& progress, std::int64_t samples, int world, int rank) {
  ddp::samplers::DistributedSamplerOptions options(world, rank);
  options.seed = 3;
  ddp::samplers::DistributedSampler sampler(samples, options);
  sampler.set_state(ddp::samplers::SamplerState(progress.epoch, progress.position, progress.replicas, progress.offset));
  const auto state = sampler.state();
  progress = Progress{state.epoch, state.position, state.num_replicas, state.offset.value_or(0)};
  return sampler;
}

// The counters after `trained` more samples per rank of the sampler's share; an epoch consumed to its
// end gives the next one's start.
void advance(Progress& progress, const ddp::samplers::DistributedSampler& sampler, std::int64_t trained,
             std::int64_t samples) {
  const auto state = sampler.state(progress.position + trained);
  progress = Progress{state.epoch, state.position, state.num_replicas, state.offset.value_or(0)};
  if (progress.offset >= samples) progress = Progress{progress.epoch + 1, 0, progress.replicas, 0};
}

std::vector<std::int64_t> next_batch(ddp::samplers::DistributedSampler& sampler, int batch) {
  const auto indices = sampler.next(static_cast<std::size_t>(batch));
  if (!indices || indices->empty()) throw ddp::Error("live demo: the sampler's share ended before its epoch's offset did");
  return {indices->begin(), indices->end()};
}

torch::Tensor rows(const torch::Tensor& t, const std::vector<std::int64_t>& indices) {
  return t.index_select(0, torch::tensor(indices, torch::kLong));
}

// Appends one record a line to its file (no buffer: a line written survives the process's death).
// examples/sample_log.h logs samples per epoch only; the reference comparison needs each step's
// batch of each rank.
class StepSampleLog {
 public:
  explicit StepSampleLog(const std::string& path) {
    if (!path.empty()) fd_ = ddp::detail::create_new_file(path, 0644, /*append=*/true), path_ = path;
  }
  void record(std::int64_t step, const Progress& before, int rank, int world, const std::vector<std::int64_t>& indices) {
    if (!fd_.valid()) return;
    std::string line = "samples step " + std::to_string(step) + " epoch " + std::to_string(before.epoch) + " rank " +
                       std::to_string(rank) + " world " + std::to_string(world) + ":";
    for (std::size_t k = 0; k < indices.size(); ++k) line += (k == 0 ? " " : ",") + std::to_string(indices[k]);
    line += "\n";
    ddp::detail::write_all(fd_.get(), line.data(), line.size(), path_);
  }

 private:
  ddp::detail::FileDescriptor fd_;
  std::string path_;
};

torch::nn::Sequential make_net() {
  torch::manual_seed(1);
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
}

torch::optim::SGD make_optimizer(const torch::nn::Sequential& net) {
  return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
}

// The parameters, one value a line ("%.9g": a float exactly).
void write_params(const torch::nn::Sequential& net, const std::string& path) {
  std::string text;
  char line[64];
  for (const auto& p : net->parameters()) {
    const auto flat = p.detach().contiguous().view(-1);
    const auto* values = flat.data_ptr<float>();
    for (std::int64_t i = 0; i < flat.numel(); ++i) {
      std::snprintf(line, sizeof line, "%.9g\n", static_cast<double>(values[i]));
      text += line;
    }
  }
  ddp::detail::write_file_atomically(path, text, 0644);
}

void write_params_once(const torch::nn::Sequential& net, const Args& args, std::int64_t steps) {
  ddp::detail::StateWriter params;
  for (const auto& p : net->parameters()) params.tensor(p);
  if (!args.params_out.empty()) write_params(net, args.params_out + "." + std::to_string(::getpid()));
  std::printf("live demo: finished %lld steps pid %d params %016llx\n", static_cast<long long>(steps),
              static_cast<int>(::getpid()), static_cast<unsigned long long>(ddp::detail::fnv1a64(params.bytes())));
  std::fflush(stdout);
}

// Restart-based elastic (no FaultTolerant): the launcher restarts every worker at each membership
// change; the checkpoint carries the model, the optimizer and the sampler's counters.
int train_restart(const Args& args) {
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const int attempt = restarts == nullptr ? 0 : std::atoi(restarts);
  ddp::InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::milliseconds(args.timeout_ms);
  init.join_timeout = init.timeout;
  auto group = ddp::init_process_group(init);
  const int world = group->size();
  const int rank = group->rank();
  std::printf("live demo: started pid %d attempt %d rank %d world %d\n", static_cast<int>(::getpid()), attempt, rank,
              world);
  const DataSet data = make_data(args.samples);
  StepSampleLog samples_log(args.log_samples.empty()
                                ? ""
                                : ddp::str(args.log_samples, ".", attempt, ".", ::getpid()));
  auto net = make_net();
  auto optimizer = make_optimizer(net);
  ddp::DistributedDataParallel model(net, group);
  Progress progress;
  std::int64_t step = 0;
  if (const auto latest = ddp::find_latest_valid_checkpoint(args.checkpoint_dir)) {
    const ddp::TrainingProgress resumed = ddp::load_checkpoint(latest->path, *net, &optimizer);
    step = resumed.step;
    progress = Progress{resumed.sampler.epoch, resumed.sampler.position, resumed.sampler.num_replicas,
                        resumed.sampler.offset.value_or(0)};
  }
  auto sampler = shard(progress, args.samples, world, rank);
  std::printf("live demo: round %d rank %d world %d epoch %lld offset %lld at step %lld\n", attempt + 1, rank, world,
              static_cast<long long>(progress.epoch), static_cast<long long>(progress.offset),
              static_cast<long long>(step));
  std::fflush(stdout);
  while (step < args.steps) {
    const Progress before = progress;
    const auto indices = next_batch(sampler, args.batch);
    samples_log.record(step + 1, before, rank, world, indices);
    optimizer.zero_grad();
    torch::mse_loss(model(rows(data.x, indices)), rows(data.y, indices)).backward();
    if (args.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(args.step_ms));
    optimizer.step();
    ++step;
    advance(progress, sampler, static_cast<std::int64_t>(indices.size()), args.samples);
    if (progress.epoch != before.epoch) sampler = shard(progress, args.samples, world, rank);
    std::printf("live demo: step %lld world %d at_ms %lld attempt %d\n", static_cast<long long>(step), world, wall_ms(),
                attempt);
    std::fflush(stdout);
    if (step % args.checkpoint_every == 0) {
      const ddp::samplers::SamplerState state(progress.epoch, progress.position, progress.replicas, progress.offset);
      ddp::save_checkpoint(args.checkpoint_dir, *net, &optimizer, {progress.epoch, step, state}, group);
    }
  }
  group->barrier();
  write_params_once(net, args, step);
  return 0;
}

int train(const Args& args) {
  if (!args.checkpoint_dir.empty()) return train_restart(args);
  ddp::StoreMembershipOptions membership_options;
  membership_options.settle_timeout = std::chrono::milliseconds(args.settle_ms);
  std::optional<ddp::LiveJob> job = ddp::live_job_from_environment(ddp::process_environment(), membership_options);
  if (!job) throw ddp::UsageError("live_recovery_demo runs under ddp_launch --recovery live (DDP_LIVE_STORE is unset)");
  std::printf("live demo: started pid %d member %s%s\n", static_cast<int>(::getpid()), job->member_id.c_str(),
              job->spare ? " (spare)" : job->joining ? " (joining)" : "");
  std::fflush(stdout);
  const DataSet data = make_data(args.samples);
  StepSampleLog samples_log(args.log_samples.empty() ? "" : args.log_samples + "." + std::to_string(::getpid()));
  Progress progress;
  ddp::samplers::DistributedSampler sampler(args.samples, ddp::samplers::DistributedSamplerOptions(1, 0));
  const ddp::FaultTolerant* running = nullptr;  // set once built: on_new_group prints its step
  ddp::FaultTolerantOptions options;
  options.group = job->group_options();
  options.group.timeout = std::chrono::milliseconds(args.timeout_ms);
  bool started = false;
  bool held = false;
  options.on_group_built = [&args, &started, &held](ddp::ProcessGroup& group, const ddp::Membership& m) {
    if (args.hold_group_ms <= 0 || !started || held) return;
    held = true;
    std::printf("live demo: recovery group built rank %d world %d round %llu, holding %d ms\n", group.rank(),
                group.size(), static_cast<unsigned long long>(m.round), args.hold_group_ms);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(args.hold_group_ms));
  };
  options.on_new_group = [&](ddp::ProcessGroup& group, const ddp::Membership& m) {
    sampler = shard(progress, args.samples, group.size(), group.rank());
    std::printf("live demo: round %llu rank %d world %d epoch %lld offset %lld at step %lld\n",
                static_cast<unsigned long long>(m.round), group.rank(), group.size(),
                static_cast<long long>(progress.epoch), static_cast<long long>(progress.offset),
                static_cast<long long>(running != nullptr ? running->steps() : 0));
    std::fflush(stdout);
  };
  ddp::FaultTolerant ft(job->store, job->membership, options);
  running = &ft;
  auto net = make_net();
  ddp::DistributedDataParallel model(net, ft.group());
  auto optimizer = make_optimizer(net);
  ft.track(model);
  ft.track(optimizer);
  ft.track("epoch", progress.epoch);
  ft.track("position", progress.position);
  ft.track("replicas", progress.replicas);
  ft.track("offset", progress.offset);
  if (!ft.start()) {  // a spare (ddp_launch --spares) that the job did not need
    std::printf("live demo: spare released pid %d\n", static_cast<int>(::getpid()));
    return 0;
  }
  started = true;
  while (ft.steps() < args.steps) {
    const int world = ft.group()->size();
    const int rank = ft.group()->rank();
    const Progress before = progress;
    const auto indices = next_batch(sampler, args.batch);
    samples_log.record(ft.steps() + 1, before, rank, world, indices);
    const auto x = rows(data.x, indices);
    const auto y = rows(data.y, indices);
    const bool applied = ft.step(
        [&] {
          spin_for_cpu_ms(args.spin_ms);
          optimizer.zero_grad();
          torch::mse_loss(model(x), y).backward();
          if (args.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(args.step_ms));
        },
        [&] {
          optimizer.step();
          advance(progress, sampler, static_cast<std::int64_t>(indices.size()), args.samples);
          if (progress.epoch != before.epoch) sampler = shard(progress, args.samples, world, rank);
        });
    if (applied) {
      std::printf("live demo: step %lld world %d at_ms %lld\n", static_cast<long long>(ft.steps()), world, wall_ms());
      std::fflush(stdout);
    }
  }
  ft.finish();  // the spares still waiting leave
  // The store lives in one host's launcher: nobody leaves while another still trains.
  ft.group()->barrier();
  write_params_once(net, args, ft.steps());
  return 0;
}

// One process replays the schedule: each step, every rank's batch from its own sampler, the average
// of the ranks' gradients (what DDP's all-reduce gives), one optimizer step; the samplers are made
// again at each change of the world size, from the same counters (See Note [Live demo data]).
int reference(const Args& args) {
  if (args.params_out.empty()) throw ddp::UsageError("--reference needs --params-out PATH");
  const DataSet data = make_data(args.samples);
  auto net = make_net();
  auto optimizer = make_optimizer(net);
  StepSampleLog samples_log(args.log_samples);
  Progress progress;
  std::vector<ddp::samplers::DistributedSampler> samplers;
  std::int64_t step = 0;
  int world = 0;
  for (const auto& [run_world, run_steps] : args.reference) {
    for (std::int64_t i = 0; i < run_steps; ++i) {
      if (run_world != world) {
        world = run_world;
        samplers.clear();
        for (int r = 0; r < world; ++r) {
          Progress copy = progress;
          samplers.push_back(shard(copy, args.samples, world, r));
          if (r == 0) progress = copy;
        }
      }
      const Progress before = progress;
      std::vector<torch::Tensor> sums;
      std::size_t trained = 0;
      for (int r = 0; r < world; ++r) {
        const auto indices = next_batch(samplers[static_cast<std::size_t>(r)], args.batch);
        if (r > 0 && indices.size() != trained) throw ddp::Error("live demo: ranks got batches of different sizes");
        trained = indices.size();
        optimizer.zero_grad();
        torch::mse_loss(net->forward(rows(data.x, indices)), rows(data.y, indices)).backward();
        const auto params = net->parameters();
        for (std::size_t k = 0; k < params.size(); ++k) {
          if (r == 0) {
            sums.push_back(params[k].grad().clone());
          } else {
            sums[k] += params[k].grad();
          }
        }
        samples_log.record(step + 1, before, r, world, indices);
      }
      const auto params = net->parameters();
      for (std::size_t k = 0; k < params.size(); ++k) params[k].mutable_grad().copy_(sums[k] / world);
      optimizer.step();
      ++step;
      advance(progress, samplers[0], static_cast<std::int64_t>(trained), args.samples);
      if (progress.epoch != before.epoch) {
        for (int r = 0; r < world; ++r) {
          Progress copy = progress;
          samplers[static_cast<std::size_t>(r)] = shard(copy, args.samples, world, r);
        }
      }
    }
  }
  write_params(net, args.params_out);
  std::printf("live demo: reference of %lld steps written to %s\n", static_cast<long long>(step), args.params_out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const ddp::UsageError& error) {
    std::fprintf(stderr, "live_recovery_demo: %s\n", error.what());
    return ddp::kUsageExitCode;
  }
  return ddp::run_main(argc, argv, [&args](int, char**) { return args.reference.empty() ? train(args) : reference(args); });
}
