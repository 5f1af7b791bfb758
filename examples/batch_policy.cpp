#include "examples/batch_policy.h"

#include <cmath>

#include "ddp/base/error.h"

namespace ddp::examples {

int64_t per_rank_batch_size(const TrainOptions& options, int64_t world_size) {
  if (options.batch_policy == BatchPolicy::kPerRank) return options.batch_size;
  const int64_t parts = world_size * options.grad_accum;
  if (options.global_batch_size % parts != 0) {
    throw UsageError(str("--global-batch-size ", options.global_batch_size, " does not divide among ", world_size,
                         " rank(s) x ", options.grad_accum, " micro-batch(es): pick a multiple of ", parts,
                         " (of every world size the job may run at), or --batch-policy per-rank"));
  }
  return options.global_batch_size / parts;
}

double schedule_progress(int64_t epoch, int64_t epochs, int64_t share_start, int64_t dataset_size,
                         int64_t step_in_share, int64_t steps_in_share) {
  if (epochs <= 0 || steps_in_share <= 0) return epochs > 0 ? static_cast<double>(epoch) / epochs : 0.0;
  if (share_start == 0 || dataset_size <= 0) {
    // The global step over the run's steps, computed as the examples always did.
    return static_cast<double>(epoch * steps_in_share + step_in_share) / static_cast<double>(epochs * steps_in_share);
  }
  const double done = static_cast<double>(share_start) / static_cast<double>(dataset_size);
  const double within = static_cast<double>(step_in_share) / static_cast<double>(steps_in_share);
  return (static_cast<double>(epoch) + done + (1.0 - done) * within) / static_cast<double>(epochs);
}

double scheduled_learning_rate(const TrainOptions& options, double progress) {
  if (!options.cosine_lr) return options.lr;
  constexpr double kPi = 3.14159265358979323846;
  return options.lr * 0.5 * (1.0 + std::cos(kPi * progress));
}

}  // namespace ddp::examples
