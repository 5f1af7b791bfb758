// --batch-policy and the schedule across a world-size change (examples/batch_policy.h): See Note
// [Batch policy] and Note [Schedule across a world-size change].
#include <catch2/catch.hpp>

#include <cmath>

#include "ddp/base/error.h"
#include "examples/batch_policy.h"

using ddp::examples::BatchPolicy;
using ddp::examples::TrainOptions;

TEST_CASE("per-rank keeps --batch-size; global divides --global-batch-size or says why not", "[batch_policy]") {
  TrainOptions options;
  options.batch_size = 32;
  for (int64_t world : {1, 2, 3, 5}) CHECK(ddp::examples::per_rank_batch_size(options, world) == 32);
  options.batch_policy = BatchPolicy::kGlobal;
  options.global_batch_size = 96;
  CHECK(ddp::examples::per_rank_batch_size(options, 1) == 96);
  CHECK(ddp::examples::per_rank_batch_size(options, 2) == 48);
  CHECK(ddp::examples::per_rank_batch_size(options, 3) == 32);
  options.grad_accum = 2;
  CHECK(ddp::examples::per_rank_batch_size(options, 3) == 16);
  CHECK_THROWS_AS(ddp::examples::per_rank_batch_size(options, 5), ddp::UsageError);
  try {
    ddp::examples::per_rank_batch_size(options, 5);
  } catch (const ddp::UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--global-batch-size 96 does not divide among 5 rank(s) x 2 micro-batch(es)") &&
                             Catch::Contains("multiple of 10"));
  }
}

TEST_CASE("the schedule: the global step over the run's steps while nothing changes, continuous across a change",
          "[batch_policy]") {
  // Unchanged: exactly step / total, as the examples computed it before.
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t k = 0; k < 7; ++k) {
      const double expected = static_cast<double>(epoch * 7 + k) / static_cast<double>(3 * 7);
      CHECK(ddp::examples::schedule_progress(epoch, 3, 0, 1000, k, 7) == expected);
    }
  }
  // 3 ranks x 32 on 960 samples (10 steps per epoch) stop after 4 steps of epoch 1 (offset 384): at 2
  // ranks x 32 the rest, 576 samples, takes 9 steps. The progress goes on from 1.4 / 3 to 2 / 3.
  const double before = ddp::examples::schedule_progress(1, 3, 0, 960, 4, 10);
  const double after = ddp::examples::schedule_progress(1, 3, 384, 960, 0, 9);
  CHECK(after == Approx(before));
  CHECK(ddp::examples::schedule_progress(1, 3, 384, 960, 9, 9) == Approx(2.0 / 3));
  double previous = after;
  for (int64_t k = 1; k <= 9; ++k) {  // increasing within the share
    const double now = ddp::examples::schedule_progress(1, 3, 384, 960, k, 9);
    CHECK(now > previous);
    previous = now;
  }
  TrainOptions options;
  options.lr = 0.1;
  CHECK(ddp::examples::scheduled_learning_rate(options, 0.0) == Approx(0.1));
  CHECK(ddp::examples::scheduled_learning_rate(options, 0.5) == Approx(0.05));
  CHECK(ddp::examples::scheduled_learning_rate(options, 1.0) == Approx(0.0).margin(1e-12));
  options.cosine_lr = false;
  CHECK(ddp::examples::scheduled_learning_rate(options, 0.7) == 0.1);
}
