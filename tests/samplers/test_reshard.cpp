// Re-sharding an epoch at a new world size (samplers/reshard.h): no sample of the epoch lost or seen
// twice across any number of world-size changes, against closed forms. See Note [Re-sharding at a new
// world size].
#include <torch/data.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "samplers/distributed_sampler.h"
#include "samplers/reshard.h"

using ddp::samplers::DistributedSampler;
using ddp::samplers::DistributedSamplerOptions;
using ddp::samplers::SamplerState;

namespace {

struct Flags {
  bool shuffle = true;
  bool drop_last = false;
};

DistributedSamplerOptions options_for(int64_t replicas, int64_t rank, Flags flags) {
  DistributedSamplerOptions options(replicas, rank);
  options.seed = 17;
  options.shuffle = flags.shuffle;
  options.drop_last = flags.drop_last;
  return options;
}

// Samples per rank of the rest m of an epoch, written out again (not samples_per_rank()).
int64_t rows(int64_t m, int64_t replicas, bool drop_last) {
  return drop_last ? m / replicas : (m + replicas - 1) / replicas;
}

// One segment of an epoch: a world of `replicas` ranks, each taking `take` samples (-1: all).
struct Segment {
  int64_t replicas;
  int64_t take;
};

// Runs the segments through real samplers: each rank's sampler resumes from the state rank 0 saved at
// the end of the previous segment (what a checkpoint carries) and takes its samples with next().
// Returns every sample handed out, over all ranks and segments.
std::vector<int64_t> run_segments(int64_t n, const std::vector<Segment>& segments, Flags flags, int64_t epoch) {
  std::vector<int64_t> seen;
  std::optional<SamplerState> saved;
  for (const Segment& segment : segments) {
    std::optional<SamplerState> next_state;
    for (int64_t r = 0; r < segment.replicas; ++r) {
      DistributedSampler sampler(n, options_for(segment.replicas, r, flags));
      if (saved) {
        sampler.set_state(*saved);
      } else {
        sampler.set_epoch(epoch);
      }
      CHECK(sampler.epoch() == epoch);
      int64_t taken = 0;
      while (segment.take < 0 || taken < segment.take) {
        const auto batch = sampler.next(1);
        if (!batch) break;
        seen.push_back(static_cast<int64_t>(batch->front()));
        ++taken;
      }
      if (segment.take >= 0) CHECK(taken == segment.take);
      const SamplerState state = sampler.state();
      // Every rank records the same global offset: rank 0's checkpoint speaks for all.
      if (next_state) CHECK(state.offset == next_state->offset);
      if (r == 0) next_state = state;
    }
    saved = next_state;
  }
  return seen;
}

// The closed form: the epoch's permutation P once each, plus the padding (P[0], P[1], ... wrapping) or
// minus the dropped tail of the share that finished the epoch. shares: (start offset, world size) of
// each segment, computed from the takes alone.
std::map<int64_t, int> expected_multiset(int64_t n, const std::vector<Segment>& segments, Flags flags,
                                         int64_t epoch) {
  const auto permutation = ddp::samplers::epoch_permutation(n, options_for(1, 0, flags), epoch);
  int64_t start = 0, last_start = 0, last_replicas = 1;
  for (const Segment& segment : segments) {
    if (start < n) {
      last_start = start;
      last_replicas = segment.replicas;
    }
    const int64_t count = rows(n - start, segment.replicas, flags.drop_last);
    const int64_t take = segment.take < 0 ? count : segment.take;
    start = take == count ? n : start + take * segment.replicas;
  }
  std::map<int64_t, int> multiset;
  if (n == 0) return multiset;
  const int64_t rest = n - last_start;
  const int64_t trained = last_start + rows(rest, last_replicas, flags.drop_last) * last_replicas;
  if (start < n) {  // the epoch did not end: the last segment stopped early
    for (int64_t i = 0; i < start; ++i) ++multiset[permutation[static_cast<size_t>(i)]];
    return multiset;
  }
  for (int64_t i = 0; i < std::min(n, trained); ++i) ++multiset[permutation[static_cast<size_t>(i)]];
  for (int64_t j = 0; j < trained - n; ++j) ++multiset[permutation[static_cast<size_t>(j % n)]];  // padding
  return multiset;
}

std::map<int64_t, int> as_multiset(const std::vector<int64_t>& samples) {
  std::map<int64_t, int> multiset;
  for (int64_t i : samples) ++multiset[i];
  return multiset;
}

std::string describe(const std::vector<Segment>& segments) {
  std::ostringstream text;
  for (const Segment& s : segments) text << s.replicas << " ranks x " << s.take << "; ";
  return text.str();
}

}  // namespace

TEST_CASE("one world-size change at every offset: the epoch's samples once each, as closed forms say",
          "[sampler][reshard]") {
  for (int64_t n : {0, 1, 2, 3, 4, 5, 7, 10, 13}) {
    for (Flags flags : {Flags{true, false}, Flags{true, true}, Flags{false, false}, Flags{false, true}}) {
      for (int64_t before = 1; before <= 5; ++before) {
        for (int64_t after = 1; after <= 5; ++after) {
          for (int64_t take = 0; take <= rows(n, before, flags.drop_last); ++take) {
            const std::vector<Segment> segments{{before, take}, {after, -1}};
            INFO("n=" << n << " shuffle=" << flags.shuffle << " drop_last=" << flags.drop_last << ": "
                      << describe(segments));
            const auto seen = run_segments(n, segments, flags, /*epoch=*/3);
            CHECK(as_multiset(seen) == expected_multiset(n, segments, flags, 3));
            // Beyond the padding nothing repeats: n samples (drop_last: fewer), each at most once.
            const auto multiset = as_multiset(seen);
            int64_t repeats = 0;
            for (const auto& [index, count] : multiset) repeats += count - 1;
            CHECK(repeats <= std::max(before, after) - 1);  // the padding of the share that ended the epoch
            if (flags.drop_last) CHECK(repeats == 0);
            if (!flags.drop_last) CHECK(static_cast<int64_t>(multiset.size()) == n);
          }
        }
      }
    }
  }
}

TEST_CASE("at an unchanged world size a resume is PyTorch's order exactly (no re-shard)", "[sampler][reshard]") {
  for (int64_t n : {0, 3, 10, 13}) {
    for (int64_t replicas = 1; replicas <= 5; ++replicas) {
      for (bool drop_last : {false, true}) {
        const Flags flags{true, drop_last};
        const int64_t count = rows(n, replicas, drop_last);
        for (int64_t take = 0; take <= count; ++take) {
          for (int64_t r = 0; r < replicas; ++r) {
            INFO("n=" << n << " R=" << replicas << " drop_last=" << drop_last << " take=" << take << " rank=" << r);
            const auto options = options_for(replicas, r, flags);
            DistributedSampler before(n, options);
            before.set_epoch(1);
            std::vector<int64_t> got;
            for (int64_t k = 0; k < take; ++k) got.push_back(static_cast<int64_t>(before.next(1)->front()));
            DistributedSampler after(n, options);
            after.set_state(before.state());
            CHECK(after.position() == (take < count ? take : 0));  // complete: an empty share at n
            while (auto batch = after.next(2)) got.insert(got.end(), batch->begin(), batch->end());
            CHECK(got == ddp::samplers::rank_indices(n, options, 1));
          }
        }
      }
    }
  }
}

TEST_CASE("several changes within one epoch compose (3 -> 2 -> 3 and every other order)", "[sampler][reshard]") {
  SECTION("3 -> 2 -> 3 on 20 samples: the three shares are the strided rest of one order") {
    const Flags flags{true, false};
    const auto order = ddp::samplers::epoch_permutation(20, options_for(1, 0, flags), 0);
    // 3 ranks x 2 = offsets 0..5; 2 ranks x 3 = offsets 6..11; 3 ranks take the rest, 12..19 + 1 pad.
    const std::vector<Segment> segments{{3, 2}, {2, 3}, {3, -1}};
    CHECK(as_multiset(run_segments(20, segments, flags, 0)) == expected_multiset(20, segments, flags, 0));
    DistributedSampler rank1(20, options_for(3, 1, flags));
    rank1.set_state({0, 3, 2, 12});
    CHECK(rank1.indices() == (std::vector<int64_t>{order[13], order[16], order[19]}));
    DistributedSampler rank2(20, options_for(3, 2, flags));
    rank2.set_state({0, 3, 2, 12});
    CHECK(rank2.indices() == (std::vector<int64_t>{order[14], order[17], order[0]}));  // padding: P[0]
  }
  SECTION("sweep: every pair of changes at every offset") {
    for (int64_t n : {0, 2, 7, 11}) {
      for (bool drop_last : {false, true}) {
        const Flags flags{true, drop_last};
        for (int64_t r1 = 1; r1 <= 4; ++r1) {
          for (int64_t r2 = 1; r2 <= 4; ++r2) {
            for (int64_t r3 = 1; r3 <= 4; ++r3) {
              for (int64_t t1 = 0; t1 <= rows(n, r1, drop_last); ++t1) {
                const int64_t start2 = t1 == rows(n, r1, drop_last) ? n : t1 * r1;
                for (int64_t t2 = 0; t2 <= rows(n - start2, r2, drop_last); ++t2) {
                  const std::vector<Segment> segments{{r1, t1}, {r2, t2}, {r3, -1}};
                  INFO("n=" << n << " drop_last=" << drop_last << ": " << describe(segments));
                  CHECK(as_multiset(run_segments(n, segments, flags, 2)) == expected_multiset(n, segments, flags, 2));
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the next epoch starts normally at the new world size", "[sampler][reshard]") {
  const Flags flags{true, false};
  DistributedSampler three(25, options_for(3, 0, flags));
  three.set_epoch(4);
  three.next(5);
  DistributedSampler two(25, options_for(2, 1, flags));
  two.set_state(three.state());
  CHECK(two.state().offset == 15);
  CHECK(two.indices().size() == 5);  // ceil(10 / 2)
  while (two.next(3)) {
  }
  CHECK(two.state().offset == 25);
  two.set_epoch(5);
  std::vector<int64_t> next_epoch;
  while (auto batch = two.next(4)) next_epoch.insert(next_epoch.end(), batch->begin(), batch->end());
  CHECK(next_epoch == ddp::samplers::rank_indices(25, options_for(2, 1, flags), 5));
  SECTION("a second pass of the re-sharded epoch (the loader's next begin()) is the whole epoch") {
    two.set_state({4, 5, 3, 15});
    two.reset();
    CHECK(two.indices().size() == 5);
    two.reset();
    CHECK(two.indices() == ddp::samplers::rank_indices(25, two.options(), 4));
  }
}

TEST_CASE("states that do not fit the data set are refused, the sampler unchanged", "[sampler][reshard]") {
  DistributedSampler sampler(10, options_for(2, 0, Flags{}));
  sampler.set_epoch(1);
  CHECK_THROWS_AS(sampler.set_state({3, 0, 2, 11}), ddp::InvalidArgument);   // offset beyond n
  CHECK_THROWS_AS(sampler.set_state({3, 0, 2, -1}), ddp::InvalidArgument);
  CHECK_THROWS_AS(sampler.set_state({3, 4, 2, 6}), ddp::InvalidArgument);    // 4 x 2 > 6: inconsistent
  CHECK_THROWS_AS(sampler.set_state({3, 9, 2}), ddp::InvalidArgument);       // beyond 5 per rank
  CHECK_THROWS_AS(sampler.set_state({3, -1, 2}), ddp::InvalidArgument);
  CHECK(sampler.epoch() == 1);
  CHECK(sampler.position() == 0);
  try {
    sampler.set_state({3, 0, 2, 11});
  } catch (const ddp::InvalidArgument& e) {
    CHECK_THAT(e.what(), Catch::Contains("offset 11 is outside [0, 10]"));
  }
}

TEST_CASE("a re-sharded sampler feeds LibTorch's loader, with worker threads", "[sampler][reshard]") {
  class IndexDataset : public torch::data::datasets::Dataset<IndexDataset, int64_t> {
   public:
    int64_t get(size_t index) override { return static_cast<int64_t>(index); }
    std::optional<size_t> size() const override { return 40; }
  };
  const Flags flags{true, false};
  for (size_t workers : {0, 2}) {
    std::vector<int64_t> seen;
    for (int64_t r = 0; r < 3; ++r) {
      DistributedSampler sampler(40, options_for(3, r, flags));
      sampler.set_epoch(0);
      for (int i = 0; i < 4; ++i) seen.push_back(static_cast<int64_t>(sampler.next(1)->front()));
    }
    for (int64_t r = 0; r < 2; ++r) {
      DistributedSampler sampler(40, options_for(2, r, flags));
      sampler.set_state({0, 4, 3, 12});
      auto loader = torch::data::make_data_loader(
          IndexDataset(), sampler, torch::data::DataLoaderOptions().batch_size(3).workers(workers));
      for (auto& batch : *loader) seen.insert(seen.end(), batch.begin(), batch.end());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(40);
    for (int64_t i = 0; i < 40; ++i) all[static_cast<size_t>(i)] = i;
    CHECK(seen == all);  // 12 + 28 = 40: every sample once
  }
}
