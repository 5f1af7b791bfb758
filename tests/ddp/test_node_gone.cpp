// ddp::membership_keys::mark_node_gone (See Note [Marking a lost node gone] in ddp/elastic/detail/membership_keys.h):
// what ddp_launch's launchers say of a lost node, against StoreMembership's rounds over a real
// TCPStore. The rounds here use a settle timeout of 60 s, so a round that closes is closed by the
// left count (the membership says which: Membership::closed_by), never by the timeout.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/ddp/in_process_group.h"
#include "ddp/base/error.h"
#include "ddp/elastic/membership.h"
#include "ddp/elastic/detail/membership_keys.h"

namespace {

using namespace std::chrono_literals;
using ddp::testing::serve_local_store;
namespace keys = ddp::detail::membership_keys;

// Three nodes x one worker ("node<N>/local0/attempt0"), round 1 closed with all of them.
struct ThreeNodes {
  c10::intrusive_ptr<c10d::TCPStore> store = serve_local_store();
  std::vector<std::unique_ptr<ddp::StoreMembership>> members;
  std::vector<ddp::Membership> first;

  ThreeNodes() {
    for (int n = 0; n < 3; ++n) {
      ddp::StoreMembershipOptions options;
      options.initial_size = 3;
      options.initial_rank = n;
      options.settle_timeout = 60s;
      members.push_back(std::make_unique<ddp::StoreMembership>(store, "node" + std::to_string(n) + "/local0/attempt0",
                                                               options));
    }
    std::vector<std::future<ddp::Membership>> rounds;
    for (auto& m : members) rounds.push_back(std::async(std::launch::async, [&m] { return m->next(0, 20s); }));
    for (auto& r : rounds) first.push_back(r.get());
  }
};

}  // namespace

TEST_CASE("a lost node marked gone lets the survivors close the next round by the left count", "[node_gone]") {
  ThreeNodes job;
  REQUIRE(job.first[0].world_size == 3);
  // node2 is lost: the store's launcher marks it; its own launcher (or a second report) cannot
  // count it again.
  const keys::NodeGoneMark mark = keys::mark_node_gone(*job.store, "node2", 1);
  CHECK(mark.marked == 1);
  CHECK(mark.round == 2);
  CHECK_FALSE(mark.already);
  const keys::NodeGoneMark again = keys::mark_node_gone(*job.store, "node2", 1);
  CHECK(again.marked == 0);
  CHECK(again.already);
  CHECK(job.store->add(keys::round_key(2, "left"), 0) == 1);
  auto second = std::async(std::launch::async, [&] { return job.members[1]->next(1, 20s); });
  const ddp::Membership m0 = job.members[0]->next(1, 20s);
  const ddp::Membership m1 = second.get();
  CHECK(m0.round == 2);
  CHECK(m0.world_size == 2);
  CHECK(m1.world_size == 2);
  const std::string closed_by = m0.closed_by.empty() ? m1.closed_by : m0.closed_by;
  CHECK_THAT(closed_by, Catch::Contains("closed by the left count") && Catch::Contains("1 marked gone"));
  // Once round 2 closed without node2, nothing is left to mark (it was dropped).
  const keys::NodeGoneMark late = keys::mark_node_gone(*job.store, "node2", 1);
  CHECK(late.marked == 0);
  CHECK_FALSE(late.already);
  CHECK(job.store->add(keys::round_key(3, "left"), 0) == 0);
}

TEST_CASE("a node whose worker arrived in the open round before it died is not counted twice", "[node_gone]") {
  ThreeNodes job;
  // node2's worker arrives in round 2 (it counts there as a previous member), then its host dies.
  auto node2 = std::async(std::launch::async, [&] {
    try {
      return job.members[2]->next(1, 2s).world_size;
    } catch (const ddp::TimeoutError&) {
      return -1;
    }
  });
  while (job.store->add(keys::round_key(2, "previous"), 0) < 1) std::this_thread::sleep_for(5ms);
  const keys::NodeGoneMark mark = keys::mark_node_gone(*job.store, "node2", 1);
  CHECK(mark.marked == 0);  // 1 member of round 1, less its 1 arrival in round 2
  CHECK(job.store->add(keys::round_key(2, "left"), 0) == 0);
  auto second = std::async(std::launch::async, [&] { return job.members[1]->next(1, 20s); });
  const ddp::Membership m0 = job.members[0]->next(1, 20s);
  CHECK(m0.world_size == 3);  // node2's arrival is in it: the group build then fails, the next round drops it
  CHECK(second.get().world_size == 3);
  CHECK(node2.get() == 3);
}

TEST_CASE("a node lost before the training's first round closed counts its first-round workers", "[node_gone]") {
  auto store = serve_local_store();
  const keys::NodeGoneMark mark = keys::mark_node_gone(*store, "node1", 2);
  CHECK(mark.marked == 2);
  CHECK(mark.round == 1);
  ddp::StoreMembershipOptions options;
  options.initial_size = 3;  // node0's one worker and node1's two
  options.initial_rank = 0;
  options.settle_timeout = 60s;
  ddp::StoreMembership alone(store, "node0/local0/attempt0", options);
  const ddp::Membership m = alone.next(0, 20s);
  CHECK(m.world_size == 1);
  CHECK_THAT(m.closed_by, Catch::Contains("closed by the left count"));
  // A node that joined later ("node1.r1") has no first-round workers, and other keys do not match.
  CHECK(keys::mark_node_gone(*store, "node1.r1", 0).marked == 0);
  CHECK(keys::mark_node_gone(*store, "node", 0).marked == 0);
}

TEST_CASE("a joiner fails at once when every member of the previous round is gone", "[node_gone]") {
  ThreeNodes job;
  // Every node is lost after round 1 (See Note [Every member gone] in ddp/elastic/membership.cpp): nobody
  // holds the training state, so a joiner must not wait its timeout for round 2 to close.
  for (int n = 0; n < 3; ++n) CHECK(keys::mark_node_gone(*job.store, "node" + std::to_string(n), 1).marked == 1);
  ddp::StoreMembershipOptions options;
  options.initial_size = 3;
  options.settle_timeout = 60s;
  options.joining = true;
  ddp::StoreMembership joiner(job.store, "node0.r1/local0/attempt0", options);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(joiner.next(0, 60s), Catch::Contains("every member of round 1 is gone") &&
                                             Catch::Contains("restart the job from its checkpoint"));
  CHECK(std::chrono::steady_clock::now() - start < 30s);  // not the 60 s timeout
}

TEST_CASE("a joiner waits while one member of the previous round is still there", "[node_gone]") {
  ThreeNodes job;
  CHECK(keys::mark_node_gone(*job.store, "node1", 1).marked == 1);
  CHECK(keys::mark_node_gone(*job.store, "node2", 1).marked == 1);
  ddp::StoreMembershipOptions options;
  options.initial_size = 3;
  options.settle_timeout = 60s;
  options.joining = true;
  ddp::StoreMembership joiner(job.store, "node1.r1/local0/attempt0", options);
  auto joined = std::async(std::launch::async, [&] { return joiner.next(0, 20s); });
  // node0 reaches its step boundary after the joiner arrived (else it closes round 2 without it).
  while (job.store->add(keys::round_key(2, "count"), 0) < 1) std::this_thread::sleep_for(5ms);
  const ddp::Membership m0 = job.members[0]->next(1, 20s);
  CHECK(m0.world_size == 2);
  const ddp::Membership m1 = joined.get();
  CHECK(m1.round == 2);
  CHECK(m1.joiners == std::vector<int>{1});
}

TEST_CASE("one worker marked gone, then its whole node, counts that worker once", "[node_gone]") {
  auto store = serve_local_store();
  // Before any round closed: node0's local1 (a first-round worker) dies and is marked alone.
  const keys::NodeGoneMark worker = keys::mark_node_gone(*store, "node0/local1", 1);
  CHECK(worker.marked == 1);
  CHECK(worker.round == 1);
  CHECK(keys::mark_node_gone(*store, "node0/local1", 1).marked == 0);  // exactly once
  // A later attempt of it was never in round 1: nothing to mark.
  CHECK(keys::mark_node_gone(*store, "node0/local2", 0).marked == 0);
  // Then node0's launcher is lost: its 3 first-round workers, less local1 already marked.
  const keys::NodeGoneMark node = keys::mark_node_gone(*store, "node0", 3);
  CHECK(node.marked == 2);
  CHECK(node.already);
  CHECK(store->add(keys::round_key(1, "left"), 0) == 3);
}

TEST_CASE("a worker marked gone after its node was counts nothing more", "[node_gone]") {
  ThreeNodes job;
  CHECK(keys::mark_node_gone(*job.store, "node1", 1).marked == 1);
  const keys::NodeGoneMark worker = keys::mark_node_gone(*job.store, "node1/local0", 0);
  CHECK(worker.marked == 0);
  CHECK(worker.already);
  // Another node's worker alone is marked (a member of round 1, by its id).
  CHECK(keys::mark_node_gone(*job.store, "node2/local0", 0).marked == 1);
  CHECK(job.store->add(keys::round_key(2, "left"), 0) == 2);
  CHECK(keys::worker_key_of("node2.r3/local1/attempt4") == "node2.r3/local1");
}
