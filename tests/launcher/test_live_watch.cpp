// The liveness channel of a --recovery live job (launcher/channel/live_watch.h, See Note [Lost hosts in a
// live job]): the server's pure bookkeeping, the admission decision that frees a lost node's place,
// and both ends over loopback sockets (a launcher gone without a goodbye, one gone silent, one that
// ends normally). No LibTorch: the server's on_lost here only records what the launcher would mark.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config_support.h"
#include "ddp/base/detail/route.h"
#include "loopback_listener.h"
#include "launcher/channel/job_channel.h"
#include "launcher/channel/live_watch.h"
#include "launcher/rendezvous/rounds.h"

using namespace ddp::launcher;
using namespace ddp::launcher::channel;
using namespace ddp::launcher::config;
using namespace ddp::launcher::rendezvous;
using ddp::launcher::testing::parse;
using ddp::launcher::testing::usage_error;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A server on a free loopback port, recording the nodes it lost.
struct Watched {
  int port = 0;
  std::mutex mutex;
  std::vector<LostNode> lost;
  std::unique_ptr<LiveWatchServer> server;

  explicit Watched(double silence_s) {
    const auto listener = ddp::launcher::testing::listen_on_free_loopback_port();
    port = listener.port;
    server = std::make_unique<LiveWatchServer>(listener.fd, silence_s, [this](const LostNode& node) {
      std::lock_guard<std::mutex> lock(mutex);
      lost.push_back(node);
    });
  }
  std::vector<LostNode> lost_now() {
    std::lock_guard<std::mutex> lock(mutex);
    return lost;
  }
};

// Waits (bounded: 10 s) until `done`.
bool eventually(const std::function<bool()>& done) {
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return done();
}

}  // namespace

TEST_CASE("node keys: the first round's nodes keep node<N>, later ones are told apart by round", "[live_watch]") {
  CHECK(live_node_key(0, 2) == "node2");
  CHECK(live_node_key(1, 2) == "node2.r1");
}

TEST_CASE("the liveness table: a close without goodbye or a silence is a loss, each once", "[live_watch]") {
  NodeLiveness table(3.0);
  const auto t0 = Clock::time_point{} + std::chrono::hours(1);
  REQUIRE(table.hello(1, "node1 1 host1", "10.0.0.2", t0));
  REQUIRE(table.hello(2, "node2 1 host2", "10.0.0.3", t0));
  REQUIRE(table.hello(3, "node3.r1 0 host3", "10.0.0.4", t0));
  CHECK_FALSE(table.hello(4, "", "10.0.0.5", t0));
  CHECK_FALSE(table.hello(4, "node4 x host4", "10.0.0.5", t0));
  CHECK_FALSE(table.hello(4, "node4/local0 1 host4", "10.0.0.5", t0));
  // Closed without a goodbye: lost at once, named; a second close of it is nothing.
  const auto lost2 = table.closed(2);
  REQUIRE(lost2.has_value());
  CHECK(lost2->node_key == "node2");
  CHECK(lost2->host == "host2 at 10.0.0.3");
  CHECK(lost2->first_round_workers == 1);
  CHECK_THAT(lost2->why, Catch::Contains("connection closed"));
  CHECK_FALSE(table.closed(2).has_value());
  // Silence: node1 pings, node3 does not; at the timeout only node3 is lost, once.
  table.heard(1, t0 + milliseconds(2500));
  CHECK(table.silent(t0 + milliseconds(2900)).empty());
  const auto silent = table.silent(t0 + milliseconds(3100));
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].first == 3);
  CHECK(silent[0].second.node_key == "node3.r1");
  CHECK(silent[0].second.first_round_workers == 0);
  CHECK_THAT(silent[0].second.why, Catch::Contains("nothing heard from its launcher for 3 s"));
  CHECK(table.silent(t0 + milliseconds(4000)).empty());
  CHECK_FALSE(table.closed(3).has_value());
  // A goodbye: the end of its connection is no loss (the job ended there).
  table.goodbye(1);
  CHECK(table.silent(t0 + milliseconds(9000)).empty());
  CHECK_FALSE(table.closed(1).has_value());
}

TEST_CASE("live admission counts the nodes the training has now: a lost node frees its place", "[live_watch]") {
  rendezvous::RoundRules rules;
  rules.min_nodes = 2;
  rules.max_nodes = 3;
  // At MAX with nobody lost: the newcomer waits.
  CHECK_FALSE(rendezvous::decide_live_admission(rules, 3, 0, 1).admit);
  // One lost: admitted, and the round expects the 2 survivors and the newcomer (no last call).
  const rendezvous::LiveAdmissionStep step = rendezvous::decide_live_admission(rules, 3, 1, 1);
  CHECK(step.admit);
  CHECK(step.current_nodes == 2);
  CHECK(step.expected_nodes == 3);
  // Two waiting for one freed place: admitted up to MAX.
  CHECK(rendezvous::decide_live_admission(rules, 3, 1, 2).expected_nodes == 3);
  CHECK_FALSE(rendezvous::decide_live_admission(rules, 2, 0, 0).admit);
  CHECK(rendezvous::decide_live_admission(rules, 2, 0, 1).expected_nodes == 3);
}

TEST_CASE("--rdzv_conf keep_alive_interval and keep_alive_max_attempt set the live job's silence timeout",
          "[live_watch]") {
  const auto c = parse({"--nnodes", "2:3", "--rdzv_endpoint", "host0:29400", "--recovery", "live", "--rdzv_conf",
                        "keep_alive_interval=0.5,keep_alive_max_attempt=4", "/bin/true"});
  CHECK(c.live_keep_alive_s == 0.5);
  CHECK(c.live_keep_alive_max_attempt == 4);
  const auto d = parse({"--nnodes", "2:3", "--rdzv_endpoint", "host0:29400", "--recovery", "live", "/bin/true"});
  CHECK(d.live_keep_alive_s * d.live_keep_alive_max_attempt == 5);
  CHECK_THAT(usage_error({"--rdzv_conf", "keep_alive_max_attempt=0", "/bin/true"}), Catch::Contains("integer >= 1"));
  CHECK_THAT(usage_error({"--rdzv_conf", "keep_alive_interval=-1", "/bin/true"}), Catch::Contains("keep_alive_interval"));
}

TEST_CASE("the liveness channel: a launcher killed is lost at once, a silent one after the timeout, one that "
          "ends well never",
          "[live_watch]") {
  Watched watched(1.0);
  auto killed = std::make_unique<LiveWatchClient>("127.0.0.1", watched.port, "node2 1 host2", 0.1, 1.0);
  auto fine = std::make_unique<LiveWatchClient>("127.0.0.1", watched.port, "node1 1 host1", 0.1, 1.0);
  auto done = std::make_unique<LiveWatchClient>("127.0.0.1", watched.port, "node3.r1 0 host3", 0.1, 1.0);
  std::this_thread::sleep_for(milliseconds(400));  // all three connected and pinging
  CHECK(watched.lost_now().empty());
  // A client that ends without a goodbye (its workers failed, or it was killed: the kernel closes
  // the socket the same way).
  killed.reset();
  REQUIRE(eventually([&] { return watched.lost_now().size() == 1; }));
  CHECK(watched.lost_now()[0].node_key == "node2");
  CHECK_THAT(watched.lost_now()[0].why, Catch::Contains("connection closed"));
  // Every launcher still connected hears of it (LiveAdmission's count).
  CHECK(eventually([&] { return fine->lost_nodes() == 1 && done->lost_nodes() == 1; }));
  CHECK(watched.server->lost_nodes() == 1);
  // A client whose workers succeeded says goodbye: no loss.
  done->set_succeeded(true);
  done.reset();
  std::this_thread::sleep_for(milliseconds(300));
  CHECK(watched.lost_now().size() == 1);
  fine->set_succeeded(true);
  fine.reset();
}

TEST_CASE("the liveness channel: the serving launcher gone is told after the timeout, a connection it closed and "
          "that reconnects never",
          "[live_watch]") {
  // The server drops a client silent for 0.3 s; this one pings every 1 s, so its connection is
  // closed by the server again and again (as after a partition) and reconnects each time.
  auto watched = std::make_unique<Watched>(0.3);
  LiveWatchClient client("127.0.0.1", watched->port, "node1 1 host1", 1.0, 1.0);
  REQUIRE(eventually([&] { return watched->lost_now().size() >= 2; }));
  CHECK_FALSE(client.server_lost());
  // The serving launcher ends without a goodbye (its host lost): its port refuses from now on.
  const auto gone_at = std::chrono::steady_clock::now();
  watched.reset();
  REQUIRE(eventually([&] { return client.server_lost(); }));
  // Down for 1 s, less the gap (poll 100 ms, retry 250 ms) a reconnect may have been in when it went.
  CHECK(std::chrono::steady_clock::now() - gone_at >= milliseconds(600));
}

TEST_CASE("the liveness channel: a launcher that stops pinging is lost after the silence timeout", "[live_watch]") {
  Watched watched(0.5);
  // A raw connection that says hello and then nothing (a partition: no close reaches the server).
  const int fd = start_connect("127.0.0.1", watched.port);
  REQUIRE(fd >= 0);
  LineConnection raw(fd);
  pollfd connected{fd, POLLOUT, 0};
  REQUIRE(::poll(&connected, 1, 10000) == 1);
  raw.send("hello node1 1 host1");
  REQUIRE_FALSE(raw.wants_write());
  REQUIRE(eventually([&] { return watched.lost_now().size() == 1; }));
  CHECK(watched.lost_now()[0].node_key == "node1");
  CHECK_THAT(watched.lost_now()[0].why, Catch::Contains("nothing heard from its launcher for 0.5 s"));
}

TEST_CASE("--hosts/--hostfile with a range takes --recovery live (each host joins the first one's rendezvous)",
          "[live_watch]") {
  const auto c = parse({"--hosts", "host0:1,host1:1,host2:1", "--nnodes", "2:3", "--recovery", "live", "/bin/true"});
  CHECK(c.recovery == Recovery::kLive);
  CHECK_THAT(usage_error({"--hosts", "host0:1,host1:1", "--recovery", "live", "/bin/true"}),
             Catch::Contains("--recovery live needs elastic membership"));
}

TEST_CASE("the liveness channel relays --straggler_action timings: each launcher hears every other's, named by node",
          "[live_watch]") {
  Watched watched(5.0);
  LiveWatchClient host1("127.0.0.1", watched.port, "node1 2 host1", 0.1, 5.0);
  LiveWatchClient host2("127.0.0.1", watched.port, "node2.r1 0 host2", 0.1, 5.0);
  // Both said hello before anything is relayed: the server sends only to launchers it knows.
  std::this_thread::sleep_for(milliseconds(400));
  host1.publish_timings("2:10:4000:100,3:10:4100:90");
  watched.server->publish_timings("node0", "host0", "0:10:4000:300");
  std::vector<NodeTimings> at_server, at_host1, at_host2;
  const auto gather = [](std::vector<NodeTimings>& into, std::vector<NodeTimings> more) {
    into.insert(into.end(), more.begin(), more.end());
    return into.size();
  };
  REQUIRE(eventually([&] {
    return gather(at_server, watched.server->take_timings()) >= 1 && gather(at_host2, host2.take_timings()) >= 2;
  }));
  REQUIRE(at_server.size() == 1);  // host1's; its own are not delivered back
  CHECK(at_server[0].node_key == "node1");
  CHECK(at_server[0].host_name == "host1");
  CHECK(at_server[0].items == "2:10:4000:100,3:10:4100:90");
  REQUIRE(at_host2.size() == 2);  // host1's (relayed) and host0's, in either order
  std::sort(at_host2.begin(), at_host2.end(), [](const NodeTimings& a, const NodeTimings& b) { return a.node_key < b.node_key; });
  CHECK(at_host2[0].node_key == "node0");
  CHECK(at_host2[0].host_name == "host0");
  CHECK(at_host2[0].items == "0:10:4000:300");
  CHECK(at_host2[1].node_key == "node1");
  CHECK(at_host2[1].items == "2:10:4000:100,3:10:4100:90");
  // host1 hears the server's, never its own back.
  REQUIRE(eventually([&] { return gather(at_host1, host1.take_timings()) >= 1; }));
  std::this_thread::sleep_for(milliseconds(200));
  gather(at_host1, host1.take_timings());
  REQUIRE(at_host1.size() == 1);
  CHECK(at_host1[0].node_key == "node0");
  // A relayed line that is not "<key> <host> <items>" is nothing.
  CHECK_FALSE(parse_relayed_timings("node1 host1"));
  CHECK(parse_relayed_timings("node1 host1 1:2:3:4")->items == "1:2:3:4");
  host1.set_succeeded(true);
  host2.set_succeeded(true);
}
