// ddp::live_job_from_environment (ddp/elastic/live_job.h): what a worker of `ddp_launch --recovery
// live` builds from its environment, against a real TCPStore (See Note [Live recovery with
// ddp_launch] in launcher/agent/live_recovery.cpp).
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/ddp/in_process_group.h"
#include "ddp/base/worker_variable_names.h"
#include "ddp/base/error.h"
#include "ddp/elastic/live_job.h"
#include "ddp/elastic/detail/membership_keys.h"

namespace {

using namespace std::chrono_literals;
using ddp::testing::serve_local_store;

ddp::EnvLookup worker_env(int port, int rank, int world, int restart_count) {
  return ddp::EnvironmentSnapshot::from_map({{ddp::env::kLiveStore, "127.0.0.1:" + std::to_string(port)},
                                             {ddp::env::kLivePrefix, "ddp/live/job"},
                                             {ddp::env::kLiveMember, "node" + std::to_string(rank) + "/local0"},
                                             {ddp::env::kRank, std::to_string(rank)},
                                             {ddp::env::kWorldSize, std::to_string(world)},
                                             {ddp::env::kRestartCount, std::to_string(restart_count)},
                                             // ddp_launch sets them too (unused by a live job)
                                             {ddp::env::kMasterAddr, "127.0.0.1"},
                                             {ddp::env::kMasterPort, "29500"}})
      .lookup();
}

}  // namespace

TEST_CASE("not started with --recovery live: no live job", "[live_environment]") {
  CHECK_FALSE(ddp::live_job_from_environment(ddp::EnvironmentSnapshot::from_map({}).lookup()).has_value());
}

TEST_CASE("two workers of a live job form its first round under the job's prefix", "[live_environment]") {
  auto server = serve_local_store();
  const int port = server->getPort();
  auto job0 = ddp::live_job_from_environment(worker_env(port, 0, 2, 0));
  auto job1 = ddp::live_job_from_environment(worker_env(port, 1, 2, 0));
  REQUIRE(job0.has_value());
  REQUIRE(job1.has_value());
  CHECK_FALSE(job0->joining);
  CHECK(job0->member_id == "node0/local0");
  CHECK_FALSE(job0->group_host.empty());
  auto second = std::async(std::launch::async, [&] { return job1->membership->next(0, 20s); });
  const ddp::Membership m0 = job0->membership->next(0, 20s);
  const ddp::Membership m1 = second.get();
  CHECK(m0.round == 1);
  CHECK(m1.round == 1);
  CHECK(m0.world_size == 2);
  CHECK(m0.rank == 0);  // the launcher's RANK order
  CHECK(m1.rank == 1);
  // The keys are the job's: under DDP_LIVE_PREFIX in the store, nothing at its root.
  CHECK(server->check({"ddp/live/job/" + std::string(ddp::detail::membership_keys::last_round_key())}));  // PrefixStore adds '/'
  CHECK_FALSE(server->check({ddp::detail::membership_keys::last_round_key()}));

  // A restarted worker (TORCHELASTIC_RESTART_COUNT 1) is a joiner; the launcher's mark lets the
  // survivor close the next round at once, and the joiner waits for the one after.
  auto restarted = ddp::live_job_from_environment(worker_env(port, 1, 2, 1));
  REQUIRE(restarted.has_value());
  CHECK(restarted->joining);
  REQUIRE(ddp::detail::membership_keys::mark_last_round_members_gone(*job0->store, 1));
  const auto started = std::chrono::steady_clock::now();
  const ddp::Membership alone = job0->membership->next(1, 20s);  // settle timeout: 5 s by default
  CHECK(std::chrono::steady_clock::now() - started < 4s);        // closed by the mark, not the settle timeout
  CHECK(alone.round == 2);
  CHECK(alone.world_size == 1);
  auto joined = std::async(std::launch::async, [&] { return restarted->membership->next(0, 20s); });
  // As FaultTolerant does: the member regroups once a joiner announced itself (a step boundary).
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!job0->membership->change_pending(2)) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(5ms);
  }
  const ddp::Membership with_joiner = job0->membership->next(2, 20s);
  const ddp::Membership joiner = joined.get();
  CHECK(with_joiner.round == 3);
  CHECK(with_joiner.world_size == 2);
  CHECK(joiner.rank == 1);
  CHECK(with_joiner.joiners == std::vector<int>{1});
}

TEST_CASE("an unreachable live store is one TimeoutError naming it", "[live_environment]") {
  int port = 0;
  {
    auto server = serve_local_store();
    port = server->getPort();
  }  // nothing listens there now
  try {
    ddp::live_job_from_environment(worker_env(port, 1, 2, 0), {}, 1s);
    FAIL("no error");
  } catch (const ddp::TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("could not reach the job's store 127.0.0.1:" + std::to_string(port)));
    // Our own bounded wait answered (c10d's connect overshoots: Note [Bounded connect to the master]),
    // in one line.
    CHECK_THAT(e.what(), Catch::Contains("within 1 s: nothing accepted a connection there"));
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
  }
}
