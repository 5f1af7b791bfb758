#pragma once
// How the examples size their batches and their learning-rate schedule when the world size can change
// between a checkpoint and the resume (an elastic job restarted with another WORLD_SIZE). Pure
// functions, unit-tested. See Note [Batch policy].
#include <cstdint>

#include "examples/train_options.h"

namespace ddp::examples {

// Note [Batch policy]
// ~~~~~~~~~~~~~~~~~~~
// --batch-policy per-rank (the default, what PyTorch's users expect): --batch-size is each rank's
// micro-batch at any world size, so the global batch grows and shrinks with the world.
// --batch-policy global --global-batch-size N: N samples per optimizer step at any world size, divided
// evenly: each rank's micro-batch is N / (world size x --grad-accum). A remainder is refused (a clear
// error, exit 2): DDP averages the ranks' gradients with equal weights and the sampler advances every
// rank in lock step, so uneven batches would weigh samples unequally and break the exact re-shard;
// pick N divisible by every world size the job may run at (96 for 1, 2 or 3 ranks, 120 for 1 to 6).
// --global-batch-size is explicit rather than "--batch-size x the first world size" so that a
// restarted worker needs nothing from the checkpoint to know its batch.

// Each rank's micro-batch at this world size. Throws ddp::UsageError when the global batch does not
// divide among the ranks and micro-batches.
int64_t per_rank_batch_size(const TrainOptions& options, int64_t world_size);

// Note [Schedule across a world-size change]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The cosine schedule is a function of how far the run is: epoch e of E, and within it step k of the K
// steps of this rank's share (the whole epoch, or after a resume at another world size the rest of it
// from global offset S of n samples):
//   progress = (e + S/n + (1 - S/n) * k/K) / E
// With S = 0 this is (e*K + k) / (E*K), exactly the global step over the run's steps that the examples
// always used: runs that never change their world size are unchanged, to the bit. At a change the
// progress goes on from where the samples are (S/n of the epoch), so the learning rate continues where it
// was (within one step's worth) whatever the new number of steps per epoch, and the run ends at 0.
double schedule_progress(int64_t epoch, int64_t epochs, int64_t share_start, int64_t dataset_size,
                         int64_t step_in_share, int64_t steps_in_share);

// The learning rate at that progress: --lr, or with --lr-schedule cosine lr * (1 + cos(pi * progress)) / 2.
double scheduled_learning_rate(const TrainOptions& options, double progress);

}  // namespace ddp::examples
