// DistributedSampler: PyTorch's semantics, LibTorch loader integration, resume.
#include <torch/data.h>
#include <torch/serialize/archive.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "samplers/distributed_sampler.h"

using ddp::samplers::DistributedSampler;
using ddp::samplers::DistributedSamplerOptions;

namespace {

std::vector<int64_t> drain(DistributedSampler& sampler, size_t batch_size) {
  std::vector<int64_t> out;
  while (auto batch = sampler.next(batch_size)) {
    REQUIRE(batch->size() <= batch_size);
    out.insert(out.end(), batch->begin(), batch->end());
  }
  return out;
}

// One sampler per rank, all at `epoch`; each rank's indices of that epoch.
// options with the fields set() sets (DistributedSamplerOptions is a plain struct).
template <class Set>
DistributedSamplerOptions with(DistributedSamplerOptions options, Set set) {
  set(options);
  return options;
}

std::vector<std::vector<int64_t>> all_ranks(int64_t n, DistributedSamplerOptions options,
                                            int64_t epoch, size_t batch_size = 3) {
  std::vector<std::vector<int64_t>> result;
  for (int64_t r = 0; r < options.num_replicas; ++r) {
    options.rank = r;
    DistributedSampler sampler(n, options);
    sampler.set_epoch(epoch);
    result.push_back(drain(sampler, batch_size));
  }
  return result;
}

// A dataset whose example i is the number i: batches show which indices the loader asked for.
class IndexDataset : public torch::data::datasets::Dataset<IndexDataset, int64_t> {
 public:
  explicit IndexDataset(size_t n) : n_(n) {}
  int64_t get(size_t index) override { return static_cast<int64_t>(index); }
  std::optional<size_t> size() const override { return n_; }

 private:
  size_t n_;
};

}  // namespace

TEST_CASE("every sample is covered once, by exactly one rank, for many sizes", "[sampler]") {
  for (int64_t replicas = 1; replicas <= 7; ++replicas) {
    for (int64_t n : {0, 1, 2, 3, 5, 6, 7, 13, 64, 100}) {
      for (bool shuffle : {true, false}) {
        INFO("n=" << n << " R=" << replicas << " shuffle=" << shuffle);
        const auto options = with(DistributedSamplerOptions(replicas, 0), [&](auto& o) { o.shuffle = shuffle; o.seed = 11; });
        const auto ranks = all_ranks(n, options, /*epoch=*/2);
        const int64_t per_rank = (n + replicas - 1) / replicas;
        std::map<int64_t, int> seen;
        for (const auto& mine : ranks) {
          CHECK(static_cast<int64_t>(mine.size()) == per_rank);
          for (int64_t i : mine) ++seen[i];
        }
        CHECK(static_cast<int64_t>(seen.size()) == n);  // complete cover, nothing outside [0, n)
        int64_t extra = 0;
        for (const auto& [index, count] : seen) {
          CHECK(index >= 0);
          CHECK(index < n);
          extra += count - 1;
        }
        CHECK(extra == per_rank * replicas - n);  // only the padding is seen twice
        if (n % replicas == 0) CHECK(extra == 0);   // disjoint
      }
    }
  }
}

TEST_CASE("ranks take strided slices of one global order; padding wraps around", "[sampler]") {
  SECTION("without shuffle the slices are r, r+R, ... of 0..n-1 padded from its start") {
    const auto ranks = all_ranks(10, with(DistributedSamplerOptions(4, 0), [](auto& o) { o.shuffle = false; }), 0);
    // total 12: 0..9 then 0, 1
    CHECK(ranks[0] == (std::vector<int64_t>{0, 4, 8}));
    CHECK(ranks[1] == (std::vector<int64_t>{1, 5, 9}));
    CHECK(ranks[2] == (std::vector<int64_t>{2, 6, 0}));
    CHECK(ranks[3] == (std::vector<int64_t>{3, 7, 1}));
  }
  SECTION("padding longer than the dataset repeats it several times (n < R)") {
    const auto order = ddp::samplers::epoch_order(2, with(DistributedSamplerOptions(7, 0), [](auto& o) { o.shuffle = false; }), 0);
    CHECK(order == (std::vector<int64_t>{0, 1, 0, 1, 0, 1, 0}));
  }
  SECTION("with shuffle the padding repeats the start of the permutation") {
    const auto options = with(DistributedSamplerOptions(4, 0), [](auto& o) { o.seed = 3; });
    const auto order = ddp::samplers::epoch_order(10, options, 5);
    REQUIRE(order.size() == 12);
    CHECK(order[10] == order[0]);
    CHECK(order[11] == order[1]);
    for (int64_t r = 0; r < 4; ++r) {
      const auto mine = ddp::samplers::rank_indices(10, with(options, [&](auto& o) { o.rank = r; }), 5);
      for (size_t k = 0; k < mine.size(); ++k) CHECK(mine[k] == order[static_cast<size_t>(r) + 4 * k]);
    }
  }
}

TEST_CASE("drop_last gives floor(n / R) per rank, disjoint, without padding", "[sampler]") {
  for (int64_t replicas : {1, 2, 3, 4, 8}) {
    for (int64_t n : {0, 3, 7, 10, 33}) {
      INFO("n=" << n << " R=" << replicas);
      const auto ranks = all_ranks(n, with(DistributedSamplerOptions(replicas, 0), [](auto& o) { o.drop_last = true; }), 1);
      std::set<int64_t> seen;
      for (const auto& mine : ranks) {
        CHECK(static_cast<int64_t>(mine.size()) == n / replicas);
        for (int64_t i : mine) CHECK(seen.insert(i).second);  // no repeats anywhere
      }
      CHECK(static_cast<int64_t>(seen.size()) == n / replicas * replicas);
    }
  }
  DistributedSampler sampler(10, with(DistributedSamplerOptions(4, 1), [](auto& o) { o.drop_last = true; o.shuffle = false; }));
  CHECK(sampler.size() == 2);
  CHECK(sampler.indices() == (std::vector<int64_t>{1, 5}));  // 8 and 9 are dropped
}

TEST_CASE("the order changes with the epoch and the seed, and is the same on every rank",
          "[sampler]") {
  const auto options = with(DistributedSamplerOptions(3, 0), [](auto& o) { o.seed = 42; });
  const auto epoch0 = ddp::samplers::epoch_order(50, options, 0);
  const auto epoch1 = ddp::samplers::epoch_order(50, options, 1);
  CHECK(epoch0 != epoch1);
  CHECK(epoch0 == ddp::samplers::epoch_order(50, options, 0));  // deterministic
  CHECK(epoch0 != ddp::samplers::epoch_order(50, with(options, [](auto& o) { o.seed = 43; }), 0));
  // Every rank builds the global order itself; they must agree on it for the slices to fit.
  for (int64_t epoch : {0, 1, 7}) {
    const auto ranks = all_ranks(50, options, epoch, 4);
    const auto order = ddp::samplers::epoch_order(50, options, epoch);
    for (size_t r = 0; r < ranks.size(); ++r) {
      for (size_t k = 0; k < ranks[r].size(); ++k) CHECK(ranks[r][k] == order[r + 3 * k]);
    }
  }
}

TEST_CASE("copies share the epoch: set_epoch on the kept sampler reaches the loader's copy",
          "[sampler]") {
  DistributedSampler sampler(40, with(DistributedSamplerOptions(2, 1), [](auto& o) { o.seed = 5; }));
  sampler.set_epoch(3);
  DistributedSampler copy = sampler;  // what make_data_loader does
  CHECK(copy.epoch() == 3);
  copy.reset();
  CHECK(drain(copy, 7) == ddp::samplers::rank_indices(40, sampler.options(), 3));
  sampler.set_epoch(4);
  CHECK(copy.epoch() == 4);
  copy.reset();
  CHECK(drain(copy, 7) == ddp::samplers::rank_indices(40, sampler.options(), 4));

  SECTION("clone() is independent") {
    DistributedSampler other = sampler.clone();
    sampler.set_epoch(9);
    CHECK(other.epoch() == 4);
  }
}

TEST_CASE("plugs into LibTorch's StatelessDataLoader and follows set_epoch", "[sampler]") {
  const size_t n = 23;
  const auto options = with(DistributedSamplerOptions(3, 2), [](auto& o) { o.seed = 8; });
  DistributedSampler sampler(n, options);
  for (size_t workers : {0, 2}) {
    INFO("workers=" << workers);
    auto loader = torch::data::make_data_loader(
        IndexDataset(n), sampler, torch::data::DataLoaderOptions().batch_size(4).workers(workers));
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      sampler.set_epoch(epoch);
      std::vector<int64_t> got;
      for (auto& batch : *loader) {
        CHECK(batch.size() <= 4);
        got.insert(got.end(), batch.begin(), batch.end());
      }
      CHECK(got == ddp::samplers::rank_indices(n, options, epoch));
    }
  }
}

TEST_CASE("mid-epoch resume skips the first k indices of this epoch only", "[sampler]") {
  const auto options = with(DistributedSamplerOptions(2, 0), [](auto& o) { o.seed = 1; });
  const auto full = ddp::samplers::rank_indices(21, options, 6);  // 11 per rank
  DistributedSampler sampler(21, options);
  sampler.set_epoch(6);
  sampler.set_start_index(4);
  CHECK(sampler.position() == 4);
  sampler.set_epoch(6);  // the resume loop sets the same epoch again: the start index stays
  auto loader = torch::data::make_data_loader(IndexDataset(21), sampler,
                                              torch::data::DataLoaderOptions().batch_size(3));
  std::vector<int64_t> got;
  for (auto& batch : *loader) got.insert(got.end(), batch.begin(), batch.end());
  CHECK(got == std::vector<int64_t>(full.begin() + 4, full.end()));
  // The next pass of the same epoch and the next epoch are complete again.
  got.clear();
  for (auto& batch : *loader) got.insert(got.end(), batch.begin(), batch.end());
  CHECK(got == full);
  sampler.set_epoch(7);
  CHECK(drain(sampler, 5) == ddp::samplers::rank_indices(21, options, 7));

  SECTION("set_epoch to another epoch cancels a pending start index") {
    sampler.set_start_index(3);
    sampler.set_epoch(8);
    CHECK(drain(sampler, 5).size() == 11);
  }
  SECTION("start index at the end gives an empty epoch; beyond it is an error") {
    sampler.set_start_index(11);
    CHECK_FALSE(sampler.next(4).has_value());
    CHECK_THROWS_AS(sampler.set_start_index(12), ddp::InvalidArgument);
    CHECK_THROWS_AS(sampler.set_start_index(-1), ddp::InvalidArgument);
  }
}

TEST_CASE("state survives save/load and converts to another world size", "[sampler]") {
  const auto options = with(DistributedSamplerOptions(2, 1), [](auto& o) { o.seed = 4; });
  DistributedSampler sampler(30, options);
  sampler.set_epoch(2);
  REQUIRE(sampler.next(5).has_value());
  REQUIRE(sampler.next(2).has_value());
  CHECK(sampler.position() == 7);

  torch::serialize::OutputArchive out;
  sampler.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  DistributedSampler restored(30, options);
  restored.load(in);
  CHECK(restored.epoch() == 2);
  const auto full = ddp::samplers::rank_indices(30, options, 2);
  CHECK(drain(restored, 4) == std::vector<int64_t>(full.begin() + 7, full.end()));

  SECTION("loading into a sampler with other options is a clear error") {
    std::istringstream again(bytes.str());
    torch::serialize::InputArchive in2;
    in2.load_from(again);
    DistributedSampler other(31, options);
    CHECK_THROWS_AS(other.load(in2), ddp::InvalidArgument);
  }
  SECTION("a state from 2 ranks at position 7 (14 samples) resumes 3 ranks at offset 14, exactly") {
    const auto three_options = with(DistributedSamplerOptions(3, 0), [](auto& o) { o.seed = 4; });
    DistributedSampler three(30, three_options);
    CHECK(sampler.state().offset == 14);
    three.set_state(sampler.state());
    CHECK(three.epoch() == 2);
    CHECK(three.position() == 0);  // a new share: the rest of the epoch from offset 14
    const auto order = ddp::samplers::epoch_order(30, options, 2);
    CHECK(drain(three, 4) == (std::vector<int64_t>{order[14], order[17], order[20], order[23], order[26], order[29]}));
  }
  SECTION("an archive without an offset (older files) resumes from position x num_replicas") {
    DistributedSampler one(30, with(DistributedSamplerOptions(1, 0), [](auto& o) { o.seed = 4; }));
    one.set_state({2, 7, 2});
    CHECK(one.state().offset == 14);
    const auto order = ddp::samplers::epoch_order(30, options, 2);
    CHECK(drain(one, 5) == std::vector<int64_t>(order.begin() + 14, order.end()));
  }
  SECTION("state(consumed) records what the loop consumed, not what was prefetched") {
    CHECK(sampler.state(3).position == 3);
  }
}

TEST_CASE("bad options are rejected with a clear error", "[sampler]") {
  CHECK_THROWS_AS(DistributedSampler(10, DistributedSamplerOptions(0, 0)), ddp::InvalidArgument);
  CHECK_THROWS_AS(DistributedSampler(10, DistributedSamplerOptions(2, 2)), ddp::InvalidArgument);
  CHECK_THROWS_AS(DistributedSampler(10, DistributedSamplerOptions(2, -1)), ddp::InvalidArgument);
  CHECK_THROWS_AS(DistributedSampler(-1, DistributedSamplerOptions(2, 0)), ddp::InvalidArgument);
  try {
    DistributedSampler(10, DistributedSamplerOptions(2, 5));
  } catch (const ddp::InvalidArgument& e) {
    CHECK_THAT(e.what(), Catch::Contains("rank 5") && Catch::Contains("num_replicas = 2"));
  }
}

TEST_CASE("the order equals Python's torch.utils.data.DistributedSampler", "[sampler][python]") {
  const std::string python = DDP_PYTHON;
  if (python.empty()) {
    WARN("skipped: DDP_PYTHON is empty (configure with -DDDP_PYTHON=/path/to/python with torch)");
    return;
  }
  struct Case {
    int64_t n, replicas, rank, seed, epoch;
    bool shuffle, drop_last;
  };
  const std::vector<Case> cases = {{100, 4, 1, 0, 0, true, false}, {37, 3, 2, 7, 5, true, false},
                                   {37, 3, 0, 7, 5, true, true},   {5, 8, 6, 1, 2, true, false},
                                   {1000, 2, 1, 123, 9, true, false}, {10, 3, 1, 0, 0, false, false}};
  std::ostringstream script;
  script << "from torch.utils.data.distributed import DistributedSampler as S\n"
         << "for n, R, r, seed, e, sh, dl in [";
  for (const auto& c : cases) {
    script << "(" << c.n << "," << c.replicas << "," << c.rank << "," << c.seed << "," << c.epoch
           << "," << (c.shuffle ? "True" : "False") << "," << (c.drop_last ? "True" : "False") << "),";
  }
  script << "]:\n"
         << "  s = S(range(n), num_replicas=R, rank=r, shuffle=sh, seed=seed, drop_last=dl)\n"
         << "  s.set_epoch(e)\n"
         << "  print(' '.join(str(i) for i in s))\n";
  const std::string command = python + " -c \"" + script.str() + "\" 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  while (size_t got = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, got);
  const int status = pclose(pipe);
  if (status != 0) {
    WARN("skipped: " << python << " could not run torch's DistributedSampler (exit " << status << ")");
    return;
  }
  std::istringstream lines(output);
  for (const auto& c : cases) {
    INFO("n=" << c.n << " R=" << c.replicas << " rank=" << c.rank << " seed=" << c.seed
              << " epoch=" << c.epoch << " shuffle=" << c.shuffle << " drop_last=" << c.drop_last);
    std::string line;
    REQUIRE(std::getline(lines, line));
    std::istringstream numbers(line);
    std::vector<int64_t> expected;
    for (int64_t i; numbers >> i;) expected.push_back(i);
    DistributedSamplerOptions options(c.replicas, c.rank);
    options.seed = static_cast<uint64_t>(c.seed);
    options.shuffle = c.shuffle;
    options.drop_last = c.drop_last;
    CHECK(ddp::samplers::rank_indices(c.n, options, c.epoch) == expected);
  }
}
