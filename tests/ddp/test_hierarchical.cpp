// The hierarchical collectives (ddp/distributed/hierarchical_collectives.h) against the flat ones, with
// in-process ranks on faked hosts (tests/ddp/in_process_group.h: one thread per rank, real Gloo over
// 127.0.0.1, each rank's host named by run_ranks_on_hosts); the topology and the algorithm choice
// (ddp/distributed/topology.h); which wait each collective uses (Note [Which waits block the host]).
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/runtime/detail/cuda_support.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/distributed/hierarchical_collectives.h"
#include "ddp/distributed/topology.h"
#include "tests/ddp/in_process_group.h"

namespace {

using ddp::CollectiveAlgorithm;
using ddp::testing::run_ranks_on_hosts;

struct Layout {
  int hosts;
  int per_host;
};
const std::vector<Layout> kLayouts = {{1, 1}, {1, 3}, {2, 1}, {2, 2}, {3, 2}};
// The dtypes of DDP's buckets: the parameters' own, and the fp16/bf16 hooks' wire formats.
const std::vector<torch::Dtype> kDtypes = {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16};
const std::vector<std::int64_t> kSizes = {0, 1, 1001, 40000};

// Rank r's input: smooth values in [-1, 1], different on every rank.
torch::Tensor input_of(int rank, std::int64_t numel, torch::Dtype dtype) {
  return torch::arange(numel, torch::kDouble).mul(0.37).add(1.3 * rank).sin().to(dtype);
}

double tolerance(torch::Dtype dtype) {
  if (dtype == torch::kHalf) return 2e-2;
  if (dtype == torch::kBFloat16) return 1e-1;
  if (dtype == torch::kFloat) return 1e-5;
  return 1e-12;
}

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.numel() == 0) return 0;
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

std::string last_algorithm(const ddp::ProcessGroup& group) {
  const auto records = group.recent_collectives();
  return records.empty() ? std::string("none") : std::string(records.back().algorithm);
}

struct Compared {
  std::vector<std::string> problems;  // what differed, one line each
  std::vector<std::string> algorithms;  // the algorithm each hierarchical-requested collective used
};

}  // namespace

TEST_CASE("topology: hosts and local ranks from the host names", "[hierarchical]") {
  const auto t = ddp::topology_from_identities({"b", "a", "b", "a", "c", "c"});
  REQUIRE(t.hosts() == 3);
  REQUIRE(t.host_of_rank == std::vector<int>{0, 1, 0, 1, 2, 2});
  REQUIRE(t.local_rank_of_rank == std::vector<int>{0, 0, 1, 1, 0, 1});
  REQUIRE(t.ranks_with_local_rank(1) == std::vector<int>{2, 3, 5});
  REQUIRE(t.uniform());
  REQUIRE(t.describe() == "3 hosts x 2 ranks");
  const auto uneven = ddp::topology_from_identities({"a", "a", "a", "b"});
  REQUIRE_FALSE(uneven.uniform());
  REQUIRE(uneven.describe() == "2 hosts with 3, 1 ranks");
  REQUIRE(ddp::single_host_topology(3).describe() == "1 host x 3 ranks");
  REQUIRE(ddp::one_rank_per_host_topology(2).describe() == "2 hosts x 1 rank");
  REQUIRE_FALSE(ddp::this_host_identity().empty());
}

TEST_CASE("topology: the algorithm follows the hosts; bad names are usage errors", "[hierarchical]") {
  using ddp::choose_algorithm;
  const auto two_by_two = ddp::topology_from_identities({"a", "a", "b", "b"});
  REQUIRE(choose_algorithm(CollectiveAlgorithm::kAuto, two_by_two).hierarchical);
  REQUIRE(choose_algorithm(CollectiveAlgorithm::kHierarchical, two_by_two).hierarchical);
  REQUIRE_FALSE(choose_algorithm(CollectiveAlgorithm::kFlat, two_by_two).hierarchical);
  REQUIRE_FALSE(choose_algorithm(CollectiveAlgorithm::kAuto, ddp::single_host_topology(4)).hierarchical);
  REQUIRE_FALSE(choose_algorithm(CollectiveAlgorithm::kHierarchical, ddp::one_rank_per_host_topology(4)).hierarchical);
  const auto uneven = choose_algorithm(CollectiveAlgorithm::kAuto, ddp::topology_from_identities({"a", "a", "a", "b"}));
  REQUIRE_FALSE(uneven.hierarchical);
  REQUIRE(uneven.reason.find("same number of ranks") != std::string::npos);
  REQUIRE(ddp::parse_collective_algorithm("hierarchical") == CollectiveAlgorithm::kHierarchical);
  REQUIRE(ddp::parse_collective_algorithm("flat") == CollectiveAlgorithm::kFlat);
  REQUIRE(ddp::parse_collective_algorithm("auto") == CollectiveAlgorithm::kAuto);
  REQUIRE_THROWS_AS(ddp::parse_collective_algorithm("tree"), ddp::UsageError);
}

TEST_CASE("wait mode: only NCCL on CUDA tensors is stream-ordered", "[hierarchical]") {
  using ddp::detail::WaitMode;
  REQUIRE(ddp::detail::cuda::wait_mode("nccl", torch::Device(torch::kCUDA, 0)) == WaitMode::kStreamOrdered);
  REQUIRE(ddp::detail::cuda::wait_mode("nccl", torch::Device(torch::kCPU)) == WaitMode::kBlocking);
  REQUIRE(ddp::detail::cuda::wait_mode("gloo", torch::Device(torch::kCUDA, 0)) == WaitMode::kBlocking);
  REQUIRE(ddp::detail::cuda::wait_mode("gloo", torch::Device(torch::kCPU)) == WaitMode::kBlocking);
  // Every collective of a Gloo group on CPU tensors records (and uses) the blocking wait.
  const auto waits = ddp::testing::run_ranks<std::vector<std::string>>(2, [](ddp::ProcessGroup& group) {
    auto t = torch::ones({3});
    group.allreduce(t);
    group.broadcast(t, 1);
    group.allgather(t);
    group.wait(group.allreduce_async(t), "async all-reduce");
    std::vector<std::string> seen;
    for (const auto& record : group.recent_collectives()) seen.push_back(record.wait);
    return seen;
  });
  for (const auto& seen : waits) REQUIRE(seen == std::vector<std::string>(4, "blocking"));
}

TEST_CASE("hierarchical collectives equal the flat ones on every layout, size and dtype", "[hierarchical]") {
  for (const Layout layout : kLayouts) {
    const int world = layout.hosts * layout.per_host;
    CAPTURE(layout.hosts, layout.per_host);
    const auto results = run_ranks_on_hosts<Compared>(layout.hosts, layout.per_host, [&](ddp::ProcessGroup& group) {
      Compared out;
      const auto note = [&](bool ok, const std::string& what) {
        if (!ok) out.problems.push_back(what);
      };
      for (const auto dtype : kDtypes) {
        for (const std::int64_t numel : kSizes) {
          const std::string where = ddp::str(c10::toString(dtype), " x ", numel, " on rank ", group.rank());
          // All-reduce.
          auto flat = input_of(group.rank(), numel, dtype);
          auto hierarchical = flat.clone();
          group.set_collective_algorithm(CollectiveAlgorithm::kFlat);
          group.allreduce(flat);
          group.set_collective_algorithm(CollectiveAlgorithm::kHierarchical);
          group.allreduce(hierarchical);
          out.algorithms.push_back(last_algorithm(group));
          note(max_difference(flat, hierarchical) <= tolerance(dtype) * world,
               ddp::str("all-reduce differs by ", max_difference(flat, hierarchical), " for ", where));
          // Broadcast from the first and the last rank: exact.
          for (int src : {0, world - 1}) {
            auto mine = input_of(group.rank(), numel, dtype);
            group.broadcast(mine, src);
            note(torch::equal(mine, input_of(src, numel, dtype)), ddp::str("broadcast from ", src, " differs for ", where));
          }
          // All-gather: exact, in rank order.
          const auto gathered = group.allgather(input_of(group.rank(), numel, dtype));
          bool same = static_cast<int>(gathered.size()) == world;
          for (int r = 0; same && r < world; ++r) same = torch::equal(gathered[static_cast<std::size_t>(r)], input_of(r, numel, dtype));
          note(same, ddp::str("all-gather differs for ", where));
        }
      }
      // A non-contiguous tensor is reduced in place too.
      auto strided = torch::ones({4, 6}).t();
      group.allreduce(strided);
      note(torch::equal(strided, torch::full({6, 4}, static_cast<float>(world))), "non-contiguous all-reduce");
      return out;
    });
    const bool expect_hierarchical = layout.hosts > 1 && layout.per_host > 1;
    for (const auto& rank : results) {
      for (const auto& problem : rank.problems) FAIL_CHECK(problem);
      for (const auto& algorithm : rank.algorithms) REQUIRE(algorithm == (expect_hierarchical ? "hierarchical" : "flat"));
    }
  }
}

TEST_CASE("hierarchical: auto takes it for large tensors on several hosts, flat for small ones", "[hierarchical]") {
  const auto seen = run_ranks_on_hosts<std::vector<std::string>>(2, 2, [](ddp::ProcessGroup& group) {
    std::vector<std::string> algorithms;
    auto small = torch::ones({16});
    group.allreduce(small);
    algorithms.push_back(last_algorithm(group));
    auto large = torch::ones({ddp::HierarchicalCollectives::kAutoMinBytes / 4});
    group.allreduce(large);
    algorithms.push_back(last_algorithm(group));
    algorithms.push_back(large.equal(torch::full_like(large, 4)) ? "right" : "wrong");
    algorithms.push_back(group.algorithm_choice());
    return algorithms;
  });
  for (const auto& s : seen) {
    REQUIRE(s[0] == "flat");
    REQUIRE(s[1] == "hierarchical");
    REQUIRE(s[2] == "right");
    REQUIRE(s[3].find("hierarchical (auto: 2 hosts x 2 ranks") == 0);
  }
}

TEST_CASE("hierarchical: a 64 MiB all-reduce on 2 hosts x 2 ranks", "[hierarchical]") {
  const std::int64_t numel = (std::int64_t{64} << 20) / 4;
  const auto right = run_ranks_on_hosts<int>(2, 2, [&](ddp::ProcessGroup& group) {
    auto t = torch::full({numel}, static_cast<float>(group.rank() + 1));
    t[numel - 1] = -1.0F * static_cast<float>(group.rank());
    group.allreduce(t, c10d::ReduceOp::SUM, "large all-reduce");
    const bool sums = t.narrow(0, 0, numel - 1).eq(10.0F).all().item<bool>() && t[numel - 1].item<float>() == -6.0F;
    return sums && last_algorithm(group) == "hierarchical" ? 1 : 0;
  });
  REQUIRE(right == std::vector<int>(4, 1));
}

TEST_CASE("hierarchical: a timeout names the sub-group and the ranks that did not arrive", "[hierarchical]") {
  std::atomic<int> finished{0};
  const auto errors = run_ranks_on_hosts<std::string>(
      2, 2,
      [&](ddp::ProcessGroup& group) {
        group.set_collective_algorithm(CollectiveAlgorithm::kHierarchical);
        auto warm = torch::ones({8});
        group.allreduce(warm, c10d::ReduceOp::SUM, "warm-up all-reduce");  // builds the sub-groups
        std::string error = "no error";
        if (group.rank() == 3) {
          // Stays away, alive, until the others have failed (bounded).
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
          while (finished.load() < 3 && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
          return error;
        }
        try {
          auto t = torch::ones({8});
          group.allreduce(t, c10d::ReduceOp::SUM, "test all-reduce");
        } catch (const ddp::TimeoutError& e) {
          error = e.what();
        } catch (const std::exception& e) {
          error = std::string("not a timeout: ") + e.what();
        }
        ++finished;
        return error;
      },
      std::chrono::milliseconds(1000));
  CAPTURE(errors);
  // Rank 2 waits for rank 3 inside host 1; ranks 0 and 1 wait for ranks 2 and 3 across hosts.
  REQUIRE(errors[2].find("test all-reduce #2 (hierarchical") == 0);
  REQUIRE(errors[2].find("in sub-group host 1 (ranks 2, 3)") != std::string::npos);
  REQUIRE(errors[2].find("rank(s) 3 did not arrive") != std::string::npos);
  REQUIRE(errors[0].find("in sub-group local rank 0 across hosts (ranks 0, 2)") != std::string::npos);
  REQUIRE(errors[0].find("rank(s) 2 did not arrive") != std::string::npos);
  REQUIRE(errors[1].find("in sub-group local rank 1 across hosts (ranks 1, 3)") != std::string::npos);
  REQUIRE(errors[1].find("rank(s) 3 did not arrive") != std::string::npos);
}

TEST_CASE("hierarchical: uneven hosts fall back to the flat algorithm on every rank", "[hierarchical]") {
  const auto seen = ddp::testing::run_ranks<std::vector<std::string>>(
      3,
      [](ddp::ProcessGroup& group) {
        group.set_collective_algorithm(CollectiveAlgorithm::kHierarchical);
        auto t = torch::ones({100000});
        group.allreduce(t);
        return std::vector<std::string>{last_algorithm(group), t.equal(torch::full_like(t, 3)) ? "right" : "wrong",
                                        group.algorithm_choice()};
      },
      ddp::testing::kRankTimeout, [](int rank) { return rank < 2 ? std::string("a") : std::string("b"); });
  for (const auto& s : seen) {
    REQUIRE(s[0] == "flat");
    REQUIRE(s[1] == "right");
    REQUIRE(s[2].find("2 hosts with 2, 1 ranks") != std::string::npos);
  }
}
