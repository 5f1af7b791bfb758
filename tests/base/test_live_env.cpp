// ddp_launch --recovery live: the flag's checks and the launcher-worker variables of the job's
// membership (See Note [Live recovery with ddp_launch] in launcher/agent/live_recovery.cpp).
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/worker_variables.h"
#include "ddp/base/error.h"
#include "launcher/config/config.h"
#include "launcher/agent/worker_variables.h"
#include "tests/support/env_of.h"

using ddp::testing::env_of;

namespace {

ddp::launcher::config::LaunchConfig parse_flags(std::vector<std::string> args) {
  std::vector<const char*> argv{"ddp_launch"};
  for (const auto& a : args) argv.push_back(a.c_str());
  const auto env = ddp::EnvironmentSnapshot::from_map({{"PATH", "/usr/bin:/bin"}});
  return ddp::launcher::config::parse_launch_args(static_cast<int>(argv.size()), argv.data(), env).config;
}

std::string usage_error_of(std::vector<std::string> args) {
  try {
    parse_flags(std::move(args));
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("--recovery: restart by default, live only in an elastic c10d job", "[live_launch]") {
  using ddp::launcher::config::Recovery;
  CHECK(parse_flags({"/bin/true"}).recovery == Recovery::kRestart);
  const auto live = parse_flags({"--nnodes", "2:3", "--rdzv_endpoint", "host0:29400", "--recovery", "live", "/bin/true"});
  CHECK(live.recovery == Recovery::kLive);
  CHECK(parse_flags({"--nnodes", "2:3", "--rdzv_endpoint", "host0:29400", "--recovery", "restart", "/bin/true"})
            .recovery == Recovery::kRestart);
  const std::string needs = "--recovery live needs elastic membership over a c10d store";
  CHECK_THAT(usage_error_of({"--recovery", "live", "/bin/true"}), Catch::Contains(needs));
  CHECK_THAT(usage_error_of({"--nnodes", "2", "--rdzv_endpoint", "host0:29400", "--recovery", "live", "/bin/true"}),
             Catch::Contains(needs));
  CHECK_THAT(usage_error_of({"--recovery", "sometimes", "/bin/true"}), Catch::Contains("use restart or live"));
}

TEST_CASE("the live job's place: what ddp_launch sets, a worker reads back", "[live_launch]") {
  ddp::launcher::rendezvous::NodeAssignment node;
  node.nnodes = 3;
  node.node_rank = 2;
  ddp::launcher::agent::WorkerSlot slot;
  CHECK_FALSE(ddp::parse_live_recovery_environment(env_of({})).has_value());
  for (const auto& [key, value] : ddp::launcher::agent::launcher_variables(node, slot)) {
    CHECK(key.rfind("DDP_LIVE_", 0) != 0);  // not a live job: none of its variables
  }
  slot.live = ddp::launcher::agent::WorkerSlot::LivePlace{"host0:29400", "ddp/live/job", "node2/local0/attempt1"};
  const auto vars = ddp::launcher::agent::launcher_variables(node, slot);
  const auto live = ddp::parse_live_recovery_environment(env_of({vars.begin(), vars.end()}));
  REQUIRE(live.has_value());
  CHECK(live->store_host == "host0");
  CHECK(live->store_port == 29400);
  CHECK(live->prefix == "ddp/live/job");
  CHECK(live->member_id == "node2/local0/attempt1");
  CHECK_FALSE(live->spare);
  slot.live->spare = true;  // --spares (See Note [Hot spares in ddp_launch])
  const auto spare_vars = ddp::launcher::agent::launcher_variables(node, slot);
  const auto spare = ddp::parse_live_recovery_environment(env_of({spare_vars.begin(), spare_vars.end()}));
  REQUIRE(spare.has_value());
  CHECK(spare->spare);
  std::map<std::string, std::string> bad{spare_vars.begin(), spare_vars.end()};
  bad["DDP_LIVE_SPARE"] = "yes";
  CHECK_THROWS_WITH(ddp::parse_live_recovery_environment(env_of(bad)), Catch::Contains("DDP_LIVE_SPARE='yes' must be 0 or 1"));
}

TEST_CASE("malformed live variables are refused naming the variable", "[live_launch]") {
  using ddp::env::kLiveMember;
  using ddp::env::kLivePrefix;
  using ddp::env::kLiveStore;
  auto error_of = [](std::map<std::string, std::string> vars) {
    try {
      ddp::parse_live_recovery_environment(env_of(std::move(vars)));
    } catch (const ddp::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  CHECK_THAT(error_of({{kLiveStore, "host0"}, {kLivePrefix, "p/"}, {kLiveMember, "m"}}),
             Catch::Contains("DDP_LIVE_STORE='host0' is not HOST:PORT"));
  CHECK_THAT(error_of({{kLiveStore, "host0:http"}, {kLivePrefix, "p/"}, {kLiveMember, "m"}}),
             Catch::Contains("DDP_LIVE_STORE"));
  CHECK_THAT(error_of({{kLiveStore, "host0:1"}, {kLiveMember, "m"}}), Catch::Contains("DDP_LIVE_PREFIX must be"));
  CHECK_THAT(error_of({{kLiveStore, "host0:1"}, {kLivePrefix, "p/"}, {kLiveMember, ""}}),
             Catch::Contains("DDP_LIVE_MEMBER must be"));
  const auto v6 = ddp::parse_live_recovery_environment(
      env_of({{kLiveStore, "[::1]:29400"}, {kLivePrefix, "p/"}, {kLiveMember, "m"}}));
  REQUIRE(v6.has_value());
  CHECK(v6->store_host == "::1");
}
