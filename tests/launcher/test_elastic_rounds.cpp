// Unit tests of the elastic rounds (launcher/rendezvous/rounds.h, See Note [Elastic rounds]): when a
// round closes, who is in it, its proved member list, and --nnodes MIN:MAX on the command line.
// No processes but the supervisor test's sleeping workers: the plugin drives the same functions
// against the store.
#include <catch2/catch.hpp>

#include <csignal>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "config_support.h"
#include "launcher/rendezvous/records.h"
#include "launcher/rendezvous/rounds.h"
#include "ddp/base/detail/hostlist.h"
#include "launcher/hosts/remote_command.h"
#include "launcher/agent/supervisor.h"

using namespace ddp::launcher;
using namespace ddp::launcher::agent;
using namespace ddp::launcher::hosts;
using namespace ddp::launcher::process;
using namespace ddp::launcher::rendezvous;
using ddp::launcher::testing::parse;
using ddp::launcher::testing::usage_error;

namespace {

RoundRules rules_2_4() {
  RoundRules rules;
  rules.min_nodes = 2;
  rules.max_nodes = 4;
  rules.last_call_s = 3;
  rules.timeout_s = 30;
  return rules;
}

RoundView view(int joined, double quiet_s, double waited_s, int expected = 0) {
  RoundView v;
  v.joined = joined;
  v.since_last_join_s = quiet_s;
  v.waited_s = waited_s;
  v.expected = expected;
  return v;
}

// Replays joins at the given times (seconds) and asks each 0.1 s what the round does; returns the
// time and head count at which it closed or timed out.
struct Outcome {
  RoundStep step = RoundStep::kWait;
  double at_s = -1;
  int joined = 0;
};
Outcome replay(const RoundRules& rules, const std::vector<double>& joins, int expected = 0) {
  int joined = 0;
  double last_join = 0;
  for (int tick = 0; tick <= 1000; ++tick) {
    const double t = tick / 10.0;
    while (joined < static_cast<int>(joins.size()) && joins[joined] <= t + 1e-9) last_join = joins[joined++];
    const RoundStep step = decide_round(rules, view(joined, t - last_join, t - joins.front(), expected));
    if (step != RoundStep::kWait) return {step, t, joined};
  }
  return {};
}

}  // namespace

TEST_CASE("a round closes at MAX at once, at MIN after the last call", "[launcher][elastic]") {
  const RoundRules rules = rules_2_4();
  // Four at once: MAX, no last call.
  Outcome o = replay(rules, {0, 0.1, 0.2, 0.3});
  CHECK(o.step == RoundStep::kClose);
  CHECK(o.joined == 4);
  CHECK(o.at_s == Approx(0.3));
  // Two, then quiet: closes 3 s after the second.
  o = replay(rules, {0, 1});
  CHECK(o.step == RoundStep::kClose);
  CHECK(o.joined == 2);
  CHECK(o.at_s == Approx(4.0));
  // A third within the window restarts it.
  o = replay(rules, {0, 1, 3.5});
  CHECK(o.joined == 3);
  CHECK(o.at_s == Approx(6.5));
  // One alone never closes: it times out at --rdzv_timeout.
  o = replay(rules, {0});
  CHECK(o.step == RoundStep::kTimedOut);
  CHECK(o.joined == 1);
  CHECK(o.at_s == Approx(30));
  // A second node after the timeout is too late for the first; before it, in time.
  CHECK(replay(rules, {0, 29}).step == RoundStep::kClose);
}

TEST_CASE("a re-rendezvous closes as soon as every expected node is back", "[launcher][elastic]") {
  const RoundRules rules = rules_2_4();
  // Three nodes, one lost: the two survivors expect 2 and close without the last call.
  Outcome o = replay(rules, {0, 0.4}, expected_next_round(rules, 3, 1, 0));
  CHECK(o.step == RoundStep::kClose);
  CHECK(o.at_s == Approx(0.4));
  // A newcomer waiting for a running 2-node job: 3 expected.
  CHECK(expected_next_round(rules, 2, 0, 1) == 3);
  o = replay(rules, {0, 0.2, 0.5}, 3);
  CHECK(o.joined == 3);
  CHECK(o.at_s == Approx(0.5));
  // Never below MIN, whatever is expected: one survivor of two still waits for a second node.
  CHECK(decide_round(rules, view(1, 10, 10, 1)) == RoundStep::kWait);
  // An expected node that does not come: the last call still closes the round.
  o = replay(rules, {0, 0.2}, 3);
  CHECK(o.joined == 2);
  CHECK(o.at_s == Approx(3.2));
  // At most MAX.
  CHECK(expected_next_round(rules, 4, 0, 3) == 4);
  CHECK(expected_next_round(rules, 1, 3, 0) == 0);
}

TEST_CASE("a node joining a running job never closes the round itself", "[launcher][elastic]") {
  RoundRules rules = rules_2_4();
  rules.min_nodes = 1;
  RoundView v = view(1, 10, 10);
  CHECK(decide_round(rules, v) == RoundStep::kClose);  // the job's first round: one node may start it
  v.joins_running_job = true;
  CHECK(decide_round(rules, v) == RoundStep::kWait);   // beside a running job: wait to be admitted
  v.joined = 4;
  CHECK(decide_round(rules, v) == RoundStep::kWait);
  v.waited_s = 30;
  CHECK(decide_round(rules, v) == RoundStep::kTimedOut);
}

TEST_CASE("members and newcomers", "[launcher][elastic]") {
  CHECK(node_rank_in({0, 1, 3}, 3) == 2);
  CHECK(node_rank_in({0, 1, 3}, 0) == 0);
  CHECK(node_rank_in({0, 1, 3}, 2) == -1);  // claimed after the close: next round
  const RoundRules rules = rules_2_4();
  CHECK(admits_newcomers(rules, 2, 1, true));
  CHECK_FALSE(admits_newcomers(rules, 4, 1, true));   // at MAX: the newcomer waits
  CHECK_FALSE(admits_newcomers(rules, 2, 1, false));  // --max_restarts used up
  CHECK_FALSE(admits_newcomers(rules, 2, 0, true));
}

TEST_CASE("the closed record is proved and strict", "[launcher][elastic]") {
  const Token token("s3cret");
  const std::string record = make_closed_record(token, "job", 2, {0, 1, 3});
  std::string error;
  const auto members = parse_closed_record(token, "job", 2, 4, record, error);
  REQUIRE(members);
  CHECK(*members == std::vector<int>{0, 1, 3});
  CHECK_FALSE(parse_closed_record(token, "job", 3, 4, record, error));  // another round
  CHECK_FALSE(parse_closed_record(token, "other", 2, 4, record, error));
  CHECK_FALSE(parse_closed_record(Token("guess"), "job", 2, 4, record, error));
  CHECK_THAT(error, Catch::Contains("DDP_RDZV_TOKEN"));
  CHECK_FALSE(parse_closed_record(token, "job", 2, 2, record, error));  // slot 3 of at most 2 nodes
  for (const std::string& junk : {std::string(""), std::string("closed"), std::string("closed 1,0 ab"),
                                  std::string("closed 0,0 ab"), std::string("closed -1 ab"), std::string("closed ,1 ab")}) {
    INFO(junk);
    CHECK_FALSE(parse_closed_record(token, "job", 2, 4, junk, error));
    CHECK_THAT(error, Catch::Contains(closed_key("job", 2)));
  }
  CHECK(closed_key("job", 2) == "ddp_rdzv/job/r2/closed");
  CHECK(slot_key(round_id("job", 2), 1) == "ddp_rdzv/job/r2/slot/1");
  std::vector<int> slots;
  CHECK(parse_members("0,2", 4, slots));
  CHECK(format_members(slots) == "0,2");
  CHECK_FALSE(parse_members("0,02", 4, slots));  // found by fuzz_store_values: it read back as "0,2"
}

TEST_CASE("--nnodes MIN:MAX on the command line", "[launcher][elastic][config]") {
  const auto c = parse({"--nnodes", "2:3", "--rdzv_endpoint", "h:29400", "--rdzv_id", "j", "--rdzv_conf",
                        "last_call_timeout=1.5", "/bin/true"});
  CHECK(c.elastic);
  CHECK(c.min_nnodes == 2);
  CHECK(c.nnodes == 3);
  CHECK(c.rdzv_last_call_s == 1.5);
  const auto fixed = parse({"--nnodes", "2:2", "--rdzv_endpoint", "h:29400", "/bin/true"});
  CHECK_FALSE(fixed.elastic);
  CHECK(fixed.nnodes == 2);
  CHECK(parse({"--nnodes", "1:4", "--rdzv_endpoint", "h", "/bin/true"}).rdzv_last_call_s == 3);  // the default
  CHECK_THAT(usage_error({"--nnodes", "2:3", "/bin/true"}), Catch::Contains("needs the c10d rendezvous"));
  CHECK_THAT(usage_error({"--nnodes", "3:2", "--rdzv_endpoint", "h", "/bin/true"}), Catch::Contains("MIN is above MAX"));
  CHECK_THAT(usage_error({"--nnodes", "2:3", "--rdzv_endpoint", "h", "--rdzv_conf", "last_call_timeout=x", "/bin/true"}),
             Catch::Contains("last_call_timeout"));
  // Every launcher feature in every mode (See Note [One node agent]): nothing refused with a range.
  const auto watched = parse({"--nnodes", "2:3", "--rdzv_endpoint", "h", "--hang_timeout", "5", "--metrics_port", "9100",
                              "/bin/true"});
  CHECK(watched.hang_timeout_s == 5);
  CHECK(watched.metrics_port == 9100);
}

TEST_CASE("each host of an elastic host list joins the rounds, with no fixed node rank", "[launcher][elastic]") {
  RemoteJob job;
  job.launcher_path = "/opt/ddp/bin/ddp_launch";
  job.working_dir = "/work";
  job.program = {"./train"};
  job.master_addr = "h1";
  job.nnodes = 3;
  job.elastic_nnodes = "2:3";
  job.rdzv_endpoint = "h1:29400";
  job.rdzv_id = "job7";
  const HostSlots host{"h2", 1, {0}};
  CHECK(remote_command_line(job, host, 1, false) ==
        "cd /work && exec /opt/ddp/bin/ddp_launch --nnodes=2:3 --rdzv_endpoint=h1:29400 --rdzv_id=job7 "
        "--nproc_per_node=1 --watch_stdin -- ./train");
  // Given on the local command line: passed on as given, not added twice.
  job.rdzv_endpoint.clear();
  job.rdzv_id.clear();
  job.passed_flags = {"--rdzv_endpoint=h9:1234", "--rdzv_id=mine"};
  CHECK(remote_command_line(job, host, 1, false) ==
        "cd /work && exec /opt/ddp/bin/ddp_launch --rdzv_endpoint=h9:1234 --rdzv_id=mine --nnodes=2:3 "
        "--nproc_per_node=1 --watch_stdin -- ./train");
  // The local launcher accepts the range with a host list (each host's launcher has the c10d rendezvous).
  CHECK(parse({"--hosts", "h1:1,h2:1", "--nnodes", "2:3", "/bin/true"}).elastic);
}

TEST_CASE("a membership change stops the running group at once", "[launcher][elastic]") {
  // See Note [Elastic rounds]: while a round runs, the supervisor polls the membership hook; its line
  // stops the workers (SIGTERM) as another host's failure would, and supervise returns.
  SupervisorOptions options;
  options.program_path = "/bin/sh";
  options.program_args = {"sh", "-c", "exec sleep 30"};
  options.monitor_interval_s = 0.02;
  options.shutdown_grace_s = 5;
  int polls = 0;
  const auto started = std::chrono::steady_clock::now();
  options.membership_change = [&]() -> std::optional<std::string> {
    ++polls;
    if (std::chrono::steady_clock::now() - started < std::chrono::milliseconds(300)) return std::nullopt;
    return std::string("1 node waits to join the job");
  };
  int groups = 0;
  const GroupFactory make_group = [&](int) {
    ++groups;
    std::vector<WorkerLaunch> group(2);
    for (int lr = 0; lr < 2; ++lr) {
      group[lr].local_rank = group[lr].rank = lr;
      group[lr].env = {"PATH=/usr/bin:/bin"};
      group[lr].stdout_to_console = group[lr].stderr_to_console = false;
    }
    return group;
  };
  SignalPipe signals;
  const SupervisorResult result = supervise(options, signals, make_group);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  CHECK(groups == 1);
  CHECK(polls >= 2);
  CHECK(result.exit_code != 0);  // the workers ended by SIGTERM: not a success
  REQUIRE(result.root_cause);
  CHECK(result.root_cause->signal == SIGTERM);
  CHECK(seconds < 5);  // a hang guard (the grace period), not a timing test
}
