#pragma once
// The training programs under `ddp_launch --recovery live`: their step goes through
// ddp::FaultTolerant, so that a lost worker costs the survivors the step in flight, not their
// processes. See Note [Live training].
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddp/elastic/fault_tolerant.h"
#include "ddp/elastic/live_job.h"
#include "examples/train_options.h"

namespace ddp::examples {

// Note [Live training]
// ~~~~~~~~~~~~~~~~~~~~
// train_common.cpp's loop is the same with and without live recovery; under ddp_launch --recovery
// live (DDP_LIVE_STORE set) it differs in four places:
//   - the group is FaultTolerant's (a group of this process alone until start()), DDP, the optimizer
//     and the GradScaler (--amp fp16) are tracked, and so are three counters of the loop: the epoch,
//     the epoch's exact global sample offset (samplers/reshard.h) and the global step;
//   - a checkpoint (--resume) is read only by the workers of the job's start, before start(): a
//     restarted worker (a joiner) receives everything from a survivor instead;
//   - each optimizer step is ft.step(compute, apply): compute() runs the step's micro-batches
//     (forward, backward: DDP's all-reduces), apply() steps the optimizer and advances the counters,
//     so a joiner admitted after a step receives that step's offset;
//   - after a regroup (a step dropped, or a joiner admitted) on_new_group gives the loop the new rank
//     and world size, and the loop starts the epoch again from the tracked offset: a new sampler
//     share of the rest of the epoch at the new world size (no sample lost or seen twice), at the
//     batch size the batch policy gives at that size (Note [Batch policy]).
// The rest (the epoch-end evaluation, checkpoint writes, --checkpoint-on-signal) are collectives of
// the current group outside ft.step: a peer lost there ends the job as without live recovery (resume
// it from its checkpoint). --zero is refused: a lost rank's optimizer shard exists nowhere else.
struct LiveTraining {
  LiveJob job;
  std::unique_ptr<FaultTolerant> ft;
  int launcher_rank = 0;        // RANK and WORLD_SIZE the launcher gave this process
  int launcher_world_size = 1;
  int local_world_size = 1;     // processes on this host
  // Called once a round's group holds the state (FaultTolerantOptions::on_new_group): the loop's
  // runtime follows the group there.
  std::function<void(ProcessGroup&, const Membership&)> on_new_group;
  bool regrouped = false;  // set at each new group; the loop re-shards the epoch and clears it
};

// nullptr unless this process was started by ddp_launch --recovery live. Throws ddp::UsageError for
// what cannot run live (a mode other than ddp, --zero), naming why.
std::unique_ptr<LiveTraining> live_training_from_environment(const TrainOptions& options);

// --die-at-step N (tests): the last rank of the job's first round SIGKILLs itself before the
// backward of optimizer step N (1-based), mid-epoch; the survivors' first step after the loss then
// waits until the launcher's restart of it waits to join (bounded), so that a test sees it rejoin
// whatever the machine's speed. With --die-after-spares N it first waits (bounded) until N spares
// wait in the pool, so that a test sees a spare take its place. `step`: the steps applied so far.
// No-op without the flag.
void die_or_wait_for_test(const TrainOptions& options, LiveTraining* live, int rank, int world_size, int64_t step);

// FNV-1a of the parameters' bytes: equal on every rank of a job in sync.
uint64_t parameters_checksum(const torch::nn::Module& module);

}  // namespace ddp::examples
