#include "examples/live_training.h"

#include <torch/torch.h>

#include <signal.h>

#include <chrono>
#include <thread>

#include "ddp/base/worker_variables.h"
#include "ddp/base/error.h"
#include "ddp/base/detail/store_values.h"
#include "ddp/base/str.h"
#include "ddp/checkpoint/detail/state_bytes.h"

namespace ddp::examples {
namespace {

// Bound of every collective of a round: how long a silent peer (a partition, a hung host) takes to be
// detected, and how long the ranks may wait for each other outside the step (a checkpoint write).
constexpr auto kGroupTimeout = std::chrono::minutes(2);
// --die-at-step: how long the survivors wait for the killed worker's restart to ask to join.
constexpr auto kRejoinBound = std::chrono::seconds(60);

// --die-after-spares: a spare still loading its data when the worker dies comes into a later round
// (the world shrinks, then grows back), so a test that needs the spare in the dead rank's place waits
// for it (See Note [Hot spares] in ddp/elastic/membership.h).
void wait_for_spares(std::int64_t spares, const LiveTraining* live) {
  if (live == nullptr) throw UsageError("--die-after-spares needs ddp_launch --recovery live --spares");
  const auto deadline = std::chrono::steady_clock::now() + kRejoinBound;
  while (live->job.membership->spares_waiting() < spares) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw TimeoutError(str("--die-after-spares: ", spares, " spare(s) did not wait in the pool within ",
                             detail::seconds_of(kRejoinBound), " s (does ddp_launch have --spares?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::unique_ptr<LiveTraining> live_training_from_environment(const TrainOptions& options) {
  const EnvLookup env = process_environment();
  std::optional<LiveJob> job = live_job_from_environment(env);
  if (!job) return nullptr;
  if (options.mode != Mode::kDdp) {
    throw UsageError(str("ddp_launch --recovery live needs --mode ddp (this is --mode ", mode_name(options.mode), ")"));
  }
  if (options.zero) {
    throw UsageError("--zero cannot run under ddp_launch --recovery live: a lost rank's shard of the optimizer state "
                     "exists nowhere else, so the survivors could not go on; drop --zero, or use --recovery restart");
  }
  const WorkerEnvironment worker = parse_worker_environment(env);
  auto live = std::make_unique<LiveTraining>();
  live->job = std::move(*job);
  live->launcher_rank = worker.rank;
  live->launcher_world_size = worker.world_size;
  live->local_world_size = worker.local_world_size;
  FaultTolerantOptions ft_options;
  ft_options.group = live->job.group_options();
  ft_options.group.timeout = kGroupTimeout;
  LiveTraining* self = live.get();  // owns the FaultTolerant, so it outlives the callback
  ft_options.on_new_group = [self](ProcessGroup& group, const Membership& membership) {
    self->regrouped = true;
    if (self->on_new_group) self->on_new_group(group, membership);
  };
  live->ft = std::make_unique<FaultTolerant>(live->job.store, live->job.membership, std::move(ft_options));
  return live;
}

void die_or_wait_for_test(const TrainOptions& options, LiveTraining* live, int rank, int world_size, int64_t step) {
  if (options.die_at_step <= 0) return;
  // A spare's first round is the loss's (it takes the dead rank's place and runs that step again).
  const bool first_round = live == nullptr || (live->ft->regroups() == 1 && !live->job.joining && !live->job.spare);
  if (first_round && step + 1 == options.die_at_step && rank == world_size - 1) {
    if (options.die_after_spares > 0) wait_for_spares(options.die_after_spares, live);
    ::raise(SIGKILL);
  }
  // The survivors' rank 0 holds its backward (the others wait in its all-reduce) until the restarted
  // worker asks to join; the step's agreement then admits it.
  if (live == nullptr || rank != 0 || world_size >= live->launcher_world_size) return;
  const auto deadline = std::chrono::steady_clock::now() + kRejoinBound;
  while (!live->job.membership->change_pending(live->ft->membership().round)) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw TimeoutError(str("--die-at-step: the killed worker's restart did not ask to join within ",
                             detail::seconds_of(kRejoinBound), " s (does ddp_launch have --max_restarts 1?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

uint64_t parameters_checksum(const torch::nn::Module& module) {
  detail::StateWriter bytes;
  for (const auto& p : module.parameters()) bytes.tensor(p.detach().cpu());
  return detail::fnv1a64(bytes.bytes());
}

}  // namespace ddp::examples
