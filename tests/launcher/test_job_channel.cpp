// The launchers' job channel in one process: a coordinator and three links on 127.0.0.1, no
// workers. See Note [Coordinated restarts] in launcher/channel/job_channel.cpp.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "ddp/base/detail/route.h"
#include "loopback_listener.h"
#include "launcher/channel/job_channel.h"
#include "launcher/channel/job_coordinator.h"
#include "launcher/channel/job_link.h"
#include "launcher/process/worker_process.h"

using namespace ddp::launcher;
using namespace ddp::launcher::channel;
using namespace ddp::launcher::process;

namespace {

struct Job {
  int port = 0;
  std::unique_ptr<JobCoordinator> coordinator;
  std::vector<std::unique_ptr<JobLink>> links;

  Job(int nnodes, int max_restarts, double join_timeout_s = 30, std::vector<int> linked = {}) {
    const auto listener = ddp::launcher::testing::listen_on_free_loopback_port();
    port = listener.port;
    coordinator =
        std::make_unique<JobCoordinator>(listener.fd, JobCoordinatorOptions{nnodes, max_restarts, join_timeout_s});
    if (linked.empty()) {
      for (int k = 0; k < nnodes; ++k) linked.push_back(k);
    }
    for (int k : linked) links.push_back(std::make_unique<JobLink>(options(k)));
  }
  JobLinkOptions options(int node) const {
    JobLinkOptions o;
    o.coordinator_host = "127.0.0.1";
    o.coordinator_port = port;
    o.node_rank = node;
    o.first_rank = node;
    o.host_name = "host" + std::to_string(node);
    return o;
  }
  // Pumps every link until `done` (bounded: 10 s).
  bool pump_until(const std::function<bool()>& done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      for (auto& l : links) l->pump();
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  bool all_named(int nnodes) {
    return pump_until([&] {
      for (auto& l : links) {
        if (l->name_of_node(nnodes - 1) == "node " + std::to_string(nnodes - 1)) return false;
      }
      return true;
    });
  }
};

// A launcher that says hello and then nothing (no pings): closed to play a lost one.
int silent_launcher(int port, int node) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
  const std::string n = std::to_string(node);
  const std::string hello = "hello " + n + " " + n + " 1 host" + n + "\n";
  REQUIRE(::write(fd, hello.data(), hello.size()) == static_cast<ssize_t>(hello.size()));
  return fd;
}

}  // namespace

TEST_CASE("a failure on one node stops every node, and all restart as one round", "[job_channel]") {
  Job job(3, 1);
  REQUIRE(job.all_named(3));
  CHECK(job.links[0]->name_of_node(2) == "host2 (node 2, rank 2)");
  CHECK(job.links[2]->name_of_rank(1) == "rank 1 on host1");
  job.links[2]->report_failure(0, "rank 2 exited with 3");
  std::optional<std::string> stop0, stop1;
  REQUIRE(job.pump_until([&] {
    if (!stop0) stop0 = job.links[0]->take_stop(0);
    if (!stop1) stop1 = job.links[1]->take_stop(0);
    return stop0 && stop1;
  }));
  CHECK(*stop0 == "host2 (node 2, rank 2): rank 2 exited with 3");
  CHECK(*stop1 == *stop0);
  CHECK_FALSE(job.links[2]->take_stop(0));  // its own failure, acknowledged only
  CHECK_FALSE(job.links[0]->take_stop(0));  // once

  SignalPipe signals;
  const auto finish = [&](int node, int round, const char* kind) {
    return std::async(std::launch::async, [&, node, round, kind] {
      std::string why;
      return job.links[node]->finish_round(round, kind, 10, signals, why);
    });
  };
  {
    auto a = finish(0, 0, "failed"), b = finish(1, 0, "ok"), c = finish(2, 0, "failed");
    CHECK(a.get() == RoundVerdict::kRestart);
    CHECK(b.get() == RoundVerdict::kRestart);
    CHECK(c.get() == RoundVerdict::kRestart);
  }
  // Round 1 succeeds everywhere: the job is done. A failure in it would end it too (1 restart).
  auto a = finish(0, 1, "ok"), b = finish(1, 1, "ok"), c = finish(2, 1, "ok");
  CHECK(a.get() == RoundVerdict::kDone);
  CHECK(b.get() == RoundVerdict::kDone);
  CHECK(c.get() == RoundVerdict::kDone);
}

TEST_CASE("a launcher gone without a goodbye is named to every other, and the job ends", "[job_channel]") {
  Job job(3, 5, 30, {0, 2});
  const int lost = silent_launcher(job.port, 1);
  REQUIRE(job.all_named(3));
  ::close(lost);
  std::optional<std::string> stop;
  // The coordinator writes to each link in turn: one link may read the news a pump before the
  // other (under load, links[0] had none yet when links[1] had its stop), so wait for both.
  REQUIRE(job.pump_until([&] {
    if (!stop) stop = job.links[1]->take_stop(0);
    return stop.has_value() && !job.links[0]->news().empty();
  }));
  CHECK_THAT(*stop, Catch::Contains("host1 (node 1, rank 1) was lost: its launcher's connection"));
  REQUIRE(job.links[0]->news().size() == 1);
  CHECK(job.links[0]->news()[0] == *stop);
  // An elastic job's next round expects one node fewer (See Note [Elastic rounds]).
  CHECK(job.links[0]->lost_nodes() == 1);
  REQUIRE(job.pump_until([&] { return job.links[1]->lost_nodes() == 1; }));
  // With restarts left, still no restart: a lost node does not come back (membership is fixed).
  SignalPipe signals;
  std::string why;
  auto other = std::async(std::launch::async, [&] {
    std::string w;
    return job.links[1]->finish_round(0, "failed", 10, signals, w);
  });
  CHECK(job.links[0]->finish_round(0, "failed", 10, signals, why) == RoundVerdict::kDone);
  CHECK(other.get() == RoundVerdict::kDone);
}

TEST_CASE("with no restart left a failed node hears at once which node fell silent", "[job_channel]") {
  Job job(3, 0, 30, {0, 2});
  const int silent = silent_launcher(job.port, 1);
  REQUIRE(job.all_named(3));
  const auto quiet_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1200);
  job.pump_until([&] { return std::chrono::steady_clock::now() >= quiet_until; });  // host1 silent for over 1 s
  SignalPipe signals;
  std::string why;
  const auto start = std::chrono::steady_clock::now();
  CHECK(job.links[0]->finish_round(0, "failed", 10, signals, why) == RoundVerdict::kDone);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));  // not the round's 10 s
  REQUIRE_FALSE(job.links[0]->news().empty());
  CHECK_THAT(job.links[0]->news()[0], Catch::Contains("host1 (node 1, rank 1): nothing heard from its launcher for"));
  ::close(silent);
}

TEST_CASE("a round that a node never ends is ended after the join timeout, naming the node", "[job_channel]") {
  Job job(3, 2, 0.5, {0, 2});
  const int silent = silent_launcher(job.port, 1);
  REQUIRE(job.all_named(3));
  SignalPipe signals;
  auto other = std::async(std::launch::async, [&] {
    std::string w;
    return job.links[1]->finish_round(0, "ok", 10, signals, w);
  });
  std::string why;
  CHECK(job.links[0]->finish_round(0, "failed", 10, signals, why) == RoundVerdict::kDone);
  CHECK(other.get() == RoundVerdict::kDone);
  REQUIRE_FALSE(job.links[0]->news().empty());
  CHECK_THAT(job.links[0]->news()[0],
             Catch::Contains("host1 (node 1, rank 1) did not report the end of round 0 within 0.5 s"));
  ::close(silent);
}

TEST_CASE("every launcher hears the job's progress and names the ranks that did not arrive", "[job_channel]") {
  Job job(3, 0);
  REQUIRE(job.all_named(3));
  job.links[0]->publish_progress(0, {{0, 15}});
  job.links[1]->publish_progress(0, {{1, 15}});
  job.links[2]->publish_progress(0, {{2, 14}});
  std::string behind;
  REQUIRE(job.pump_until([&] {
    behind = job.links[0]->describe_behind(0, {{0, 15}});
    return behind.find("the others at up to 15") != std::string::npos;
  }));
  CHECK(behind == " (across the job, did not arrive: rank 2 on host2 at step 14, the others at up to 15)");
  CHECK(job.links[0]->describe_behind(1, {{0, 15}}).empty());  // another round: nothing known
}

TEST_CASE("--straggler_action: every launcher hears the other nodes' step timings of its round", "[job_channel]") {
  Job job(3, 0);
  REQUIRE(job.all_named(3));
  job.links[2]->publish_timings(1, "2:1:5:5");       // another round's (sent at once: nothing sent before)
  job.links[2]->publish_timings(0, "2:7:190000:0");  // held: at most one line per 200 ms
  job.links[1]->publish_timings(0, "1:7:100000:2000");
  std::vector<std::string> heard;
  REQUIRE(job.pump_until([&] {
    for (int k : {1, 2}) job.links[k]->publish_timings(0, "");  // as the agent's passes do: sends what is held
    for (auto& items : job.links[0]->take_timings(0)) heard.push_back(items);
    return heard.size() >= 2;
  }));
  std::sort(heard.begin(), heard.end());
  // Node 2's round-1 line came first on its connection and was not taken for round 0.
  CHECK(heard == std::vector<std::string>{"1:7:100000:2000", "2:7:190000:0"});
  for (const std::string& items : job.links[1]->take_timings(0)) CHECK(items.rfind("2:", 0) == 0);  // never its own
  CHECK(job.links[0]->take_timings(0).empty());  // each text once
}
