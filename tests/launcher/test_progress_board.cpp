// Unit tests of the heartbeat channel (ddp/runtime/agent_channel.h, launcher/observe/agent_socket.h) and of what the
// launcher makes of heartbeats: the hang watchdog's choice of stuck ranks and the Prometheus text.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "ddp/runtime/agent_channel.h"
#include "ddp/base/error.h"
#include "launcher/observe/agent_socket.h"
#include "launcher/observe/progress_board.h"
#include "tests/support/env_of.h"

using namespace ddp::launcher;
using namespace ddp::launcher::observe;
using namespace ddp::launcher::resources;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

using ddp::testing::env_of;

namespace {

ddp::AgentMessage heartbeat(int rank, int pid, std::int64_t step) {
  ddp::AgentMessage m;
  m.flags = ddp::AgentMessage::kHasStep;
  m.rank = rank;
  m.pid = pid;
  m.step = step;
  m.step_time_s = 0.25;
  m.comm_time_s = 0.05;
  m.timestamp_s = 1.7e9 + step;
  return m;
}

// m as the kernel delivers it when the process m.pid (of the launcher's user) sent it.
AgentDatagram from_worker(const ddp::AgentMessage& m) { return {m, SenderCredentials{m.pid, ::geteuid()}}; }

}  // namespace

TEST_CASE("agent messages: fixed 72-byte format, anything else is rejected", "[agent]") {
  ddp::AgentMessage m = heartbeat(3, 4242, 17);
  m.flags |= ddp::AgentMessage::kHasLoss | ddp::AgentMessage::kHasSamples;
  m.samples = 1 << 20;
  m.loss = 0.125;
  m.wait_time_s = 0.0625;
  unsigned char bytes[ddp::kAgentMessageBytes];
  ddp::encode_agent_message(m, bytes);
  const auto back = ddp::decode_agent_message(bytes, sizeof bytes);
  REQUIRE(back);
  CHECK(back->flags == m.flags);
  CHECK(back->rank == 3);
  CHECK(back->pid == 4242);
  CHECK(back->step == 17);
  CHECK(back->samples == m.samples);
  CHECK(back->step_time_s == m.step_time_s);
  CHECK(back->comm_time_s == m.comm_time_s);
  CHECK(back->loss == 0.125);
  CHECK(back->timestamp_s == m.timestamp_s);
  CHECK(back->wait_time_s == 0.0625);
  CHECK_FALSE(ddp::decode_agent_message(bytes, sizeof bytes - 1));
  bytes[0] ^= 1;  // magic
  CHECK_FALSE(ddp::decode_agent_message(bytes, sizeof bytes));
}

TEST_CASE("agent channel: no variable is a no-op, a bad one a clear error, a real socket gets the messages",
          "[agent]") {
  CHECK_FALSE(ddp::AgentChannel::from_environment(env_of({})).active());
  CHECK_FALSE(ddp::AgentChannel::from_environment(env_of({{"DDP_AGENT_SOCKET", ""}})).active());
  CHECK_THROWS_WITH(ddp::AgentChannel::from_environment(env_of({{"DDP_AGENT_SOCKET", "relative/agent.sock"}})),
                    Contains("DDP_AGENT_SOCKET='relative/agent.sock' is not an absolute path"));
  ddp::ProgressReporter silent(env_of({}));
  silent.report(8, 1.0);  // nothing to send to: must neither throw nor block
  CHECK(silent.samples() == 8);

  auto socket = AgentSocket::open(std::filesystem::temp_directory_path().string());
  const std::string dir = socket->path().substr(0, socket->path().rfind('/'));
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);  // private: only the job's user can send heartbeats

  CHECK_THROWS_WITH(ddp::ProgressReporter(env_of({{"DDP_AGENT_SOCKET", socket->path()}, {"RANK", "five"}})),
                    Contains("RANK='five' is not an integer"));
  ddp::ProgressReporter reporter(env_of({{"DDP_AGENT_SOCKET", socket->path()}, {"RANK", "5"}}));
  REQUIRE(reporter.active());
  reporter.report(16, 0.5);
  reporter.report(16);
  ddp::AgentChannel channel(socket->path());
  channel.send(heartbeat(5, 77, 9));
  std::vector<ddp::AgentMessage> got;
  socket->drain([&](const AgentDatagram& d) {
    REQUIRE(d.message);
    REQUIRE(d.sender);
    CHECK(d.sender->pid == ::getpid());  // the kernel's word, whatever the message says
    CHECK(d.sender->uid == ::geteuid());
    got.push_back(*d.message);
  });
  REQUIRE(got.size() == 3);
  CHECK(got[0].rank == 5);
  CHECK(got[0].pid == ::getpid());
  CHECK(got[0].samples == 16);
  CHECK(got[0].flags == (ddp::AgentMessage::kHasSamples | ddp::AgentMessage::kHasLoss));
  CHECK(got[0].loss == 0.5);
  CHECK(got[1].samples == 32);
  CHECK(got[1].flags == ddp::AgentMessage::kHasSamples);
  CHECK(got[2].step == 9);

  // The launcher gone: sending stays silent and non-blocking.
  const std::string path = socket->path();
  socket.reset();
  CHECK(::access(dir.c_str(), F_OK) != 0);  // the folder went with it
  for (int i = 0; i < 1000; ++i) channel.send(heartbeat(5, 77, 10 + i));
  ddp::AgentChannel late(path);
  late.send(heartbeat(5, 77, 1));
  CHECK_FALSE(late.active());
}

TEST_CASE("health probes: alive while the supervision loop turns, ready when every worker heartbeats", "[health]") {
  // See Note [Health endpoints].
  ProgressBoard board(0, 2);
  const auto t0 = SteadyClock::now();
  CHECK(board.liveness(t0, 10).ok);  // the rendezvous: alive, no group to watch
  CHECK_THAT(board.readiness().text, Contains("no worker group runs now"));
  CHECK_FALSE(board.readiness().ok);
  board.begin_attempt(0, {{0, 0, 100}, {1, 1, 101}});
  board.supervision_turned(t0);
  CHECK(board.liveness(t0 + 9s, 10).ok);
  const ProbeAnswer stalled = board.liveness(t0 + 11s, 10);
  CHECK_FALSE(stalled.ok);
  CHECK(stalled.text == "the supervision loop has not turned for 11 s (more than 10 s)");
  board.supervision_turned(t0 + 11s);
  CHECK(board.liveness(t0 + 11s, 10).ok);
  REQUIRE(board.record(from_worker(heartbeat(0, 100, 1)), t0) == AgentVerdict::kRecorded);
  CHECK(board.readiness().text == "not ready: rank 1 has not heartbeated yet");
  REQUIRE(board.record(from_worker(heartbeat(1, 101, 1)), t0) == AgentVerdict::kRecorded);
  CHECK(board.readiness().ok);
  CHECK(board.readiness().text == "ready: 2 workers heartbeating");
  board.mark_exited(0);
  CHECK(board.readiness().text == "not ready: rank 0 has ended");
  board.supervision_ended();
  CHECK(board.liveness(t0 + 1h, 10).ok);  // a round's end waits on its own bounds
  CHECK_FALSE(board.readiness().ok);
}

TEST_CASE("hang watchdog: the silent rank at the lowest step is the stuck one", "[watchdog]") {
  ProgressBoard board(0, 3);
  board.begin_attempt(0, {{0, 0, 100}, {1, 1, 101}, {2, 2, 102}});
  const auto t0 = SteadyClock::now();
  CHECK(board.stuck(t0 + 1h, 5).empty());  // no heartbeat yet: start-up is not watched
  for (int r = 0; r < 3; ++r) REQUIRE(board.record(from_worker(heartbeat(r, 100 + r, 5)), t0) == AgentVerdict::kRecorded);
  // A pid that is not this attempt's worker; a rank that is not on this node.
  CHECK(board.record(from_worker(heartbeat(1, 999, 6)), t0) == AgentVerdict::kForeignSender);
  CHECK(board.record(from_worker(heartbeat(7, 100, 6)), t0) == AgentVerdict::kForeignSender);
  CHECK(board.stuck(t0 + 4s, 5).empty());
  // Ranks 0 and 2 enter step 6 and wait in its all-reduce for rank 1, which never arrives.
  board.record(from_worker(heartbeat(0, 100, 6)), t0 + 1s);
  board.record(from_worker(heartbeat(2, 102, 6)), t0 + 1s);
  const auto stuck = board.stuck(t0 + 10s, 5);  // all three silent by now
  REQUIRE(stuck.size() == 1);
  CHECK(stuck[0].worker.rank == 1);
  CHECK(stuck[0].worker.pid == 101);
  CHECK(describe_stuck(stuck[0]) ==
        "rank 1 (pid 101, local_rank 1) made no progress for 10 s (last heartbeat at step 5; the other ranks are "
        "at step 6)");
  // Everybody at the same step and silent: all are reported. An exited rank is not watched.
  board.record(from_worker(heartbeat(1, 101, 6)), t0 + 1s);
  board.mark_exited(2);
  const auto all = board.stuck(t0 + 10s, 5);
  REQUIRE(all.size() == 2);
  CHECK(all[0].worker.rank == 0);
  CHECK(all[1].worker.rank == 1);
  CHECK(board.stuck(t0 + 10s, 0).empty());  // 0: off
  // --recovery live restarts rank 2 alone: its new process is watched, the old pid is foreign.
  board.restart_rank({2, 2, 152});
  CHECK(board.record(from_worker(heartbeat(2, 102, 7)), t0) == AgentVerdict::kForeignSender);
  CHECK(board.record(from_worker(heartbeat(2, 152, 1)), t0 + 9s) == AgentVerdict::kRecorded);  // a lower step: new
  CHECK(board.stuck(t0 + 10s, 5).empty());  // rank 2, the lowest step, was heard at 9 s
  const auto restarted = board.stuck(t0 + 20s, 5);
  REQUIRE(restarted.size() == 1);
  CHECK(restarted[0].worker.pid == 152);
  // A new attempt forgets the old one's heartbeats.
  board.begin_attempt(1, {{0, 0, 200}, {1, 1, 201}, {2, 2, 202}});
  CHECK(board.stuck(t0 + 1h, 5).empty());
  CHECK(board.snapshot().restarts == 1);
}

TEST_CASE("Prometheus text: every series with its labels and plausible values", "[metrics]") {
  ProgressBoard board(1, 4);
  board.begin_attempt(2, {{2, 0, 300}, {3, 1, 301}});
  const auto t0 = SteadyClock::now();
  board.record(from_worker(heartbeat(2, 300, 11)), t0);
  ddp::AgentMessage progress;
  progress.flags = ddp::AgentMessage::kHasSamples | ddp::AgentMessage::kHasLoss;
  progress.rank = 2;
  progress.pid = 300;
  progress.samples = 100;
  progress.loss = 0.75;
  progress.timestamp_s = 1.7e9 + 11;
  board.record(from_worker(progress), t0);
  progress.samples = 400;
  board.record(from_worker(progress), t0 + 2s);  // 300 samples in 2 s
  board.count_failure();
  GpuInfo gpu;
  gpu.index = 0;
  gpu.uuid = "GPU-1234";
  gpu.name = "Test \"GPU\"";
  gpu.total_bytes = 80ull << 30;
  gpu.free_bytes = 60ull << 30;
  gpu.utilization = 0.5;
  const std::string text = render_prometheus(board.snapshot(), {gpu});
  INFO(text);
  const std::string r2 = "{rank=\"2\",local_rank=\"0\",node_rank=\"1\"}";
  CHECK_THAT(text, Contains("# TYPE ddp_steps_total counter\nddp_steps_total" + r2 + " 10\n"));
  CHECK_THAT(text, Contains("ddp_samples_total" + r2 + " 400\n"));
  CHECK_THAT(text, Contains("ddp_samples_per_second" + r2 + " 150\n"));
  CHECK_THAT(text, Contains("ddp_step_time_seconds" + r2 + " 0.25\n"));
  CHECK_THAT(text, Contains("ddp_communication_time_seconds" + r2 + " 0.05\n"));
  CHECK_THAT(text, Contains("ddp_loss" + r2 + " 0.75\n"));
  CHECK_THAT(text, Contains("ddp_last_heartbeat_timestamp_seconds" + r2 + " 1700000011\n"));
  CHECK_THAT(text, Contains("ddp_restarts_total{node_rank=\"1\"} 2\n"));
  CHECK_THAT(text, Contains("ddp_worker_failures_total{node_rank=\"1\"} 1\n"));
  CHECK_THAT(text, Contains("ddp_world_size{node_rank=\"1\"} 4\n"));
  const std::string g = "{gpu=\"0\",uuid=\"GPU-1234\",name=\"Test \\\"GPU\\\"\"}";
  CHECK_THAT(text, Contains("ddp_gpu_memory_used_bytes" + g + " 21474836480\n"));
  CHECK_THAT(text, Contains("ddp_gpu_memory_total_bytes" + g + " 85899345920\n"));
  CHECK_THAT(text, Contains("ddp_gpu_utilization_ratio" + g + " 0.5\n"));
  // Rank 3 has said nothing: none of its series is invented.
  CHECK(text.find("rank=\"3\"") == std::string::npos);
  // Without GPUs, no GPU family at all.
  CHECK(render_prometheus(board.snapshot(), {}).find("ddp_gpu_") == std::string::npos);
}

TEST_CASE("agent socket: the kernel names the sending process, whatever pid the message claims", "[agent]") {
  auto socket = AgentSocket::open(std::filesystem::temp_directory_path().string());
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ddp::AgentChannel forger(socket->path());
    forger.send(heartbeat(0, parent, 3));  // claims to be the parent
    const int fd = ::socket(AF_UNIX, SOCK_DGRAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket->path().c_str(), socket->path().size() + 1);
    const char junk[] = "not a heartbeat";
    ::sendto(fd, junk, sizeof junk, 0, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    unsigned char bytes[ddp::kAgentMessageBytes];
    ddp::encode_agent_message(heartbeat(0, parent, 3), bytes);
    unsigned char longer[ddp::kAgentMessageBytes + 8] = {};
    std::memcpy(longer, bytes, sizeof bytes);
    ::sendto(fd, longer, sizeof longer, 0, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  std::vector<AgentDatagram> got;
  socket->drain([&](const AgentDatagram& d) { got.push_back(d); });
  REQUIRE(got.size() == 3);
  for (const auto& d : got) {
    REQUIRE(d.sender);
    CHECK(d.sender->pid == child);
    CHECK(d.sender->uid == ::geteuid());
  }
  REQUIRE(got[0].message);
  CHECK(got[0].message->pid == parent);
  CHECK_FALSE(got[1].message);  // wrong size
  CHECK_FALSE(got[2].message);  // a valid message with bytes after it

  // The board hears none of them as the parent's worker.
  ProgressBoard board(0, 1);
  board.begin_attempt(0, {{0, 0, parent}});
  CHECK(board.record(got[0], SteadyClock::now()) == AgentVerdict::kForeignSender);
  CHECK(board.record(got[1], SteadyClock::now()) == AgentVerdict::kMalformed);
  CHECK(board.record(got[2], SteadyClock::now()) == AgentVerdict::kMalformed);
  CHECK(board.snapshot().dropped.sender == 1);
  CHECK(board.snapshot().dropped.malformed == 2);
}

TEST_CASE("agent credentials: only the rank's own worker process is heard; forged keep-alives do not hide a hang",
          "[agent]") {
  ProgressBoard board(0, 2);
  board.begin_attempt(0, {{0, 0, 100}, {1, 1, 101}});
  const auto t0 = SteadyClock::now();
  REQUIRE(board.record(from_worker(heartbeat(0, 100, 5)), t0) == AgentVerdict::kRecorded);
  REQUIRE(board.record(from_worker(heartbeat(1, 101, 4)), t0) == AgentVerdict::kRecorded);
  // Rank 1 hangs at step 4; forgeries keep coming for it until t0 + 10 s.
  const auto forged = heartbeat(1, 101, 4);
  int sent = 0;
  for (auto t = t0 + 1s; t <= t0 + 10s; t += 1s) {
    // Another process of the same user, claiming rank 1's pid.
    CHECK(board.record({forged, SenderCredentials{555, ::geteuid()}}, t) == AgentVerdict::kForeignSender);
    // Rank 0's worker, claiming to be rank 1 (its own pid and rank 1's; rank 1's pid).
    CHECK(board.record({heartbeat(1, 100, 4), SenderCredentials{100, ::geteuid()}}, t) == AgentVerdict::kForeignSender);
    CHECK(board.record({forged, SenderCredentials{100, ::geteuid()}}, t) == AgentVerdict::kForeignSender);
    // Rank 1's pid, another user (a reused pid); no credentials at all.
    CHECK(board.record({forged, SenderCredentials{101, ::geteuid() + 1}}, t) == AgentVerdict::kForeignSender);
    CHECK(board.record({forged, std::nullopt}, t) == AgentVerdict::kForeignSender);
    sent += 5;
  }
  const auto stuck = board.stuck(t0 + 10s, 5);
  REQUIRE(stuck.size() == 1);
  CHECK(stuck[0].worker.rank == 1);
  CHECK(stuck[0].silent_s == Approx(10));
  const auto job = board.snapshot();
  CHECK(job.dropped.sender == sent);
  CHECK(job.dropped.malformed == 0);
  CHECK(job.dropped.values == 0);
  CHECK_THAT(render_prometheus(job, {}),
             Contains("# TYPE ddp_launch_agent_messages_dropped_total counter\n") &&
                 Contains("ddp_launch_agent_messages_dropped_total{node_rank=\"0\",reason=\"sender\"} " +
                          std::to_string(sent) + "\n") &&
                 Contains("ddp_launch_agent_messages_dropped_total{node_rank=\"0\",reason=\"malformed\"} 0\n"));
  // The real worker is heard again: not stuck any more. Drop counts survive a new attempt.
  REQUIRE(board.record(from_worker(heartbeat(0, 100, 6)), t0 + 10s) == AgentVerdict::kRecorded);
  REQUIRE(board.record(from_worker(heartbeat(1, 101, 5)), t0 + 10s) == AgentVerdict::kRecorded);
  CHECK(board.stuck(t0 + 10s, 5).empty());
  board.begin_attempt(1, {{0, 0, 200}, {1, 1, 201}});
  CHECK(board.snapshot().dropped.sender == sent);
}

TEST_CASE("validated progress: NaN, infinite, negative and decreasing values never reach the series", "[metrics]") {
  ProgressBoard board(0, 1);
  board.begin_attempt(0, {{0, 0, 100}});
  const auto t0 = SteadyClock::now();
  ddp::AgentMessage good = heartbeat(0, 100, 10);
  good.flags |= ddp::AgentMessage::kHasSamples | ddp::AgentMessage::kHasLoss;
  good.samples = 640;
  good.loss = -1.5;  // a gauge: a negative loss (a log-likelihood) is a value like any other
  REQUIRE(board.record(from_worker(good), t0) == AgentVerdict::kRecorded);

  const double nan = std::nan("");
  const double inf = HUGE_VAL;
  std::vector<std::pair<std::string, ddp::AgentMessage>> bad;
  const auto variant = [&](const std::string& what, auto change) {
    ddp::AgentMessage m = good;
    m.step = 11;
    m.samples = 704;
    change(m);
    bad.emplace_back(what, m);
  };
  variant("NaN loss", [&](ddp::AgentMessage& m) { m.loss = nan; });
  variant("infinite loss", [&](ddp::AgentMessage& m) { m.loss = -inf; });
  variant("infinite step time", [&](ddp::AgentMessage& m) { m.step_time_s = inf; });
  variant("negative communication time", [&](ddp::AgentMessage& m) { m.comm_time_s = -0.5; });
  variant("NaN timestamp", [&](ddp::AgentMessage& m) { m.timestamp_s = nan; });
  variant("negative timestamp", [&](ddp::AgentMessage& m) { m.timestamp_s = -1; });
  variant("negative samples", [&](ddp::AgentMessage& m) { m.samples = -64; });
  variant("decreasing samples", [&](ddp::AgentMessage& m) { m.samples = 639; });
  variant("decreasing step", [&](ddp::AgentMessage& m) { m.step = 9; });
  variant("step 0", [&](ddp::AgentMessage& m) { m.step = 0; });
  int n = 0;
  for (const auto& [what, m] : bad) {
    INFO(what);
    ++n;
    // Dropped and counted, but a heartbeat still: the worker itself sent it.
    CHECK(board.record(from_worker(m), t0 + n * 1s) == AgentVerdict::kInvalidValues);
    CHECK(board.stuck(t0 + n * 1s + 4s, 5).empty());
  }
  const auto job = board.snapshot();
  CHECK(job.dropped.values == static_cast<std::int64_t>(bad.size()));
  CHECK(job.dropped.sender == 0);
  const std::string text = render_prometheus(job, {});
  INFO(text);
  const std::string r0 = "{rank=\"0\",local_rank=\"0\",node_rank=\"0\"}";
  CHECK_THAT(text, Contains("ddp_steps_total" + r0 + " 9\n") && Contains("ddp_samples_total" + r0 + " 640\n") &&
                       Contains("ddp_loss" + r0 + " -1.5\n") && Contains("ddp_step_time_seconds" + r0 + " 0.25\n") &&
                       Contains("ddp_last_heartbeat_timestamp_seconds" + r0 + " 1700000010\n") &&
                       Contains("ddp_launch_agent_messages_dropped_total{node_rank=\"0\",reason=\"values\"} " +
                                std::to_string(bad.size()) + "\n"));
  CHECK(text.find(" NaN\n") == std::string::npos);
  CHECK(text.find("Inf\n") == std::string::npos);
  // Equal counters are fine (a report without progress), and the rank goes on from where it was.
  ddp::AgentMessage same = good;
  REQUIRE(board.record(from_worker(same), t0 + 20s) == AgentVerdict::kRecorded);
  same.step = 12;
  same.samples = 768;
  REQUIRE(board.record(from_worker(same), t0 + 21s) == AgentVerdict::kRecorded);
  CHECK_THAT(render_prometheus(board.snapshot(), {}), Contains("ddp_steps_total" + r0 + " 11\n"));
}
