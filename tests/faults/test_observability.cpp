// The live view of a job (issue 6, docs/observability.md), through the real ddp_launch and real
// ranks over Gloo: the hang watchdog (--hang_timeout) stops a job whose rank stopped heartbeating,
// /metrics serves the ranks' progress, and a real Prometheus server scrapes it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/runtime/agent_channel.h"
#include "launcher/process/net.h"
#include "tests/faults/fault_job.h"
#include "tests/launcher/process_harness.h"

using namespace ddp::launcher::process;
using namespace ddp::launcher::testing;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

// A TCP connection to 127.0.0.1:port (blocking), or -1.
int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET http://127.0.0.1:port/path with HTTP/1.0; the body, or nullopt when there is no 200 answer
// within `timeout` (from connecting to the last byte).
std::optional<std::string> http_get(int port, const std::string& path, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = Clock::now() + timeout;
  const int fd = connect_loopback(port);
  if (fd < 0) return std::nullopt;
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  [[maybe_unused]] ssize_t sent = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buf[16384];
  bool complete = false;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      complete = n == 0;
      break;
    }
    response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const auto body = response.find("\r\n\r\n");
  if (!complete || response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") > response.find("\r\n") ||
      body == std::string::npos) {
    return std::nullopt;
  }
  return response.substr(body + 4);
}

// "name{labels} value" lines of a Prometheus text exposition, keyed by "name{labels}".
std::map<std::string, double> parse_exposition(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return samples;
}

std::string rank_series(const std::string& name, int rank) {
  return name + "{rank=\"" + std::to_string(rank) + "\",local_rank=\"" + std::to_string(rank) + "\",node_rank=\"0\"}";
}

// Scrapes until both ranks have reported steps and a samples/s figure (bounded).
std::map<std::string, double> scrape_when_running(int port) {
  const auto deadline = Clock::now() + 40s;
  std::map<std::string, double> samples;
  while (Clock::now() < deadline) {
    if (const auto body = http_get(port, "/metrics")) {
      samples = parse_exposition(*body);
      if (samples.count(rank_series("ddp_samples_per_second", 0)) && samples.count(rank_series("ddp_samples_per_second", 1)) &&
          samples[rank_series("ddp_steps_total", 0)] > 0) {
        return samples;
      }
    }
    std::this_thread::sleep_for(200ms);
  }
  FAIL("the metrics of both ranks did not appear within 40 s");
  return samples;
}

// A 2-rank job that trains until it is told to stop, serving metrics on a free port.
struct MetricsJob {
  TempDir dir;
  int port = ddp::launcher::process::pick_free_port("127.0.0.1");
  Child launcher{job({"--nproc_per_node", "2", "--metrics_port", std::to_string(port)},
                     {"--steps", "1000000", "--step-ms", "20", "--pid-dir", dir.path()})};

  // SIGTERM to the launcher; every rank must be gone.
  void stop() {
    launcher.signal(SIGTERM);
    const auto outcome = launcher.wait(30s);
    REQUIRE(outcome);
    CHECK(outcome->exit_code == 128 + SIGTERM);
    require_gone(recorded_pids(dir.path()));
  }
};

// Connections that hold on to the metrics endpoint: `idle` ones that never send a byte and `slow`
// ones that send one byte of an endless request header a second. Closes them all at the end.
class Crowd {
 public:
  Crowd(int port, int idle, int slow) {
    for (int i = 0; i < idle + slow; ++i) {
      const int fd = connect_loopback(port);
      if (fd < 0) break;
      (i < idle ? idle_ : slow_).push_back(fd);
    }
    dribbler_ = std::thread([this] { dribble(); });
  }
  ~Crowd() {
    stop_ = true;
    dribbler_.join();
    for (int fd : idle_) ::close(fd);
    for (int fd : slow_) ::close(fd);
  }
  Crowd(const Crowd&) = delete;
  Crowd& operator=(const Crowd&) = delete;

  size_t connected() const { return idle_.size() + slow_.size(); }
  // How many of the crowd's connections the server has closed, after waiting up to `timeout` for all.
  size_t closed_by_server(std::chrono::milliseconds timeout) const {
    std::vector<int> fds = idle_;
    fds.insert(fds.end(), slow_.begin(), slow_.end());
    std::vector<bool> closed(fds.size(), false);
    size_t count = 0;
    const auto deadline = Clock::now() + timeout;
    while (count < fds.size() && Clock::now() < deadline) {
      for (size_t i = 0; i < fds.size(); ++i) {
        pollfd p{fds[i], POLLIN, 0};
        char byte = 0;
        // Ready with nothing to read (EOF) or an error (reset): the server hung up.
        if (!closed[i] && ::poll(&p, 1, 0) == 1 && ::recv(fds[i], &byte, 1, MSG_DONTWAIT) <= 0) {
          closed[i] = true;
          ++count;
        }
      }
      std::this_thread::sleep_for(100ms);
    }
    return count;
  }

 private:
  void dribble() {
    const std::string header = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    for (size_t i = 0; !stop_; ++i) {
      const char byte = i < header.size() ? header[i] : 'a';  // the header never ends
      for (int fd : slow_) [[maybe_unused]] ssize_t n = ::send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      for (int tick = 0; tick < 20 && !stop_; ++tick) std::this_thread::sleep_for(50ms);
    }
  }

  std::vector<int> idle_;
  std::vector<int> slow_;
  std::atomic<bool> stop_{false};
  std::thread dribbler_;
};

// The heartbeat socket ddp_launch made under its TMPDIR (tmp/ddp_agent_XXXXXX/agent.sock), or "".
std::string find_agent_socket(const std::string& tmp) {
  for (const auto& name : list_dir(tmp)) {
    const std::string path = tmp + "/" + name + "/agent.sock";
    if (name.rfind("ddp_agent_", 0) == 0 && ::access(path.c_str(), F_OK) == 0) return path;
  }
  return "";
}

std::string find_prometheus() {
  for (const char* candidate : {"/usr/bin/prometheus", "/usr/local/bin/prometheus"}) {
    if (::access(candidate, X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

TEST_CASE("hang watchdog: a rank that stops heartbeating is named and the job ends", "[watchdog]") {
  // The collective timeout is 120 s: only the watchdog (2 s) can end this job in time.
  TempDir dir;
  Child launcher(job({"--nproc_per_node", "2", "--hang_timeout", "2", "--shutdown_grace", "2"},
                     {"--steps", "100000", "--step-ms", "20", "--timeout-ms", "120000", "--pid-dir", dir.path()}),
                 fault("rank=1,step=4,kind=hang"));
  const auto outcome = launcher.wait(60s);
  const auto end = Clock::now();
  REQUIRE(outcome);
  require_gone(recorded_pids(dir.path()));
  const double seconds = seconds_since_fault(dir.path(), end);
  INFO(outcome->err);
  CHECK(outcome->exit_code != 0);
  // Rank 1 entered step 3 and hung before step 4; rank 0 entered step 4 and waits for it.
  CHECK_THAT(outcome->err, Contains("rank 1 (pid ") && Contains(", local_rank 1) made no progress for ") &&
                               Contains("(last heartbeat at step 3; the other ranks are at step 4)"));
  CHECK(outcome->err.find("rank 0 (pid ") == std::string::npos);  // rank 0 only waits: not named
  CHECK_THAT(outcome->err, Contains("Root cause (first observed failure)") && Contains("  rank      : 1 (local_rank: 1)") &&
                               Contains("(stopped by the hang watchdog)") && Contains("  hang      : rank 1 (pid "));
  CHECK(seconds < 2 + 2 + 3);  // hang_timeout + shutdown grace + start-up slack
  report("rank 1 hangs before step 4, --hang_timeout 2, collective timeout 120 s (2 ranks)",
         "exit " + std::to_string(outcome->exit_code) + ", the watchdog names rank 1 and its step; all ranks gone " +
             fmt_seconds(seconds) + " after the hang began");
}

TEST_CASE("hang watchdog: keep-alives forged by another process of the user do not hide a hang, and are counted",
          "[watchdog]") {
  TempDir dir;
  TempDir tmp;
  const int port = ddp::launcher::process::pick_free_port("127.0.0.1");
  Child launcher(job({"--nproc_per_node", "2", "--hang_timeout", "2", "--shutdown_grace", "2", "--metrics_port",
                      std::to_string(port)},
                     {"--steps", "100000", "--step-ms", "20", "--timeout-ms", "120000", "--pid-dir", dir.path()}),
                 fault_in("rank=1,step=4,kind=hang", tmp.path()));
  // This test process is the forger: it knows the socket and each rank's pid, and sends keep-alives
  // in their names (the pid inside the message is the worker's; the kernel's is ours).
  std::string socket;
  std::map<int, int> worker_pid;  // rank -> pid
  const auto found_by = Clock::now() + 30s;
  while ((socket.empty() || worker_pid.size() < 2) && Clock::now() < found_by) {
    socket = find_agent_socket(tmp.path());
    for (int rank : {0, 1}) {
      const std::string text = read_text(dir.path() + "/rank" + std::to_string(rank) + ".attempt0.pid");
      if (!text.empty()) worker_pid[rank] = std::stoi(text);
    }
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE_FALSE(socket.empty());
  REQUIRE(worker_pid.size() == 2);
  ddp::AgentChannel forger(socket);
  const std::string dropped_series = "ddp_launch_agent_messages_dropped_total{node_rank=\"0\",reason=\"sender\"}";
  int forged = 0;
  double dropped_seen = 0;
  std::optional<LaunchOutcome> outcome;
  const auto give_up = Clock::now() + 60s;
  while (!outcome && Clock::now() < give_up) {
    for (const auto& [rank, pid] : worker_pid) {
      ddp::AgentMessage keep_alive;  // what ProgressReporter::report(0) sends
      keep_alive.flags = ddp::AgentMessage::kHasSamples;
      keep_alive.rank = rank;
      keep_alive.pid = pid;
      keep_alive.samples = 1 << 20;
      keep_alive.timestamp_s = ddp::wall_seconds_now();
      forger.send(keep_alive);
      ++forged;
    }
    if (forged % 10 == 0) {
      if (const auto body = http_get(port, "/metrics", 2s)) {
        const auto samples = parse_exposition(*body);
        if (samples.count(dropped_series)) dropped_seen = std::max(dropped_seen, samples.at(dropped_series));
      }
    }
    outcome = launcher.wait(50ms);
  }
  const auto end = Clock::now();
  REQUIRE(outcome);
  require_gone(recorded_pids(dir.path()));
  INFO(outcome->err);
  CHECK(outcome->exit_code != 0);
  CHECK_THAT(outcome->err, Contains("rank 1 (pid " + std::to_string(worker_pid[1]) + ", local_rank 1) made no progress for ") &&
                               Contains("(last heartbeat at step 3; the other ranks are at step 4)"));
  const double seconds = seconds_since_fault(dir.path(), end);
  CHECK(seconds < 2 + 2 + 3);  // as without forgeries: hang_timeout + shutdown grace + start-up slack
  CHECK(dropped_seen >= 10);  // the forgeries were seen, and counted
  CHECK(dropped_seen <= forged);
  report("rank 1 hangs, another process of the user sends keep-alives in both ranks' names every 50 ms",
         "exit " + std::to_string(outcome->exit_code) + ", the watchdog names rank 1 " + fmt_seconds(seconds) +
             " after the hang began; /metrics counted " + std::to_string(static_cast<long>(dropped_seen)) + " of " +
             std::to_string(forged) + " forgeries as dropped");
}

TEST_CASE("/metrics: per-rank progress of a running 2-rank job, steps increase between scrapes", "[metrics]") {
  MetricsJob job;
  auto first = scrape_when_running(job.port);
  std::this_thread::sleep_for(1500ms);
  const auto second_body = http_get(job.port, "/metrics");
  REQUIRE(second_body);
  auto second = parse_exposition(*second_body);
  for (int rank : {0, 1}) {
    INFO("rank " << rank << "\n" << *second_body);
    CHECK(second[rank_series("ddp_steps_total", rank)] > first[rank_series("ddp_steps_total", rank)]);
    CHECK(second[rank_series("ddp_samples_total", rank)] > first[rank_series("ddp_samples_total", rank)]);
    // 16 samples a step, at most one step per 20 ms: 0 < samples/s <= 800.
    CHECK(second[rank_series("ddp_samples_per_second", rank)] > 0);
    CHECK(second[rank_series("ddp_samples_per_second", rank)] <= 800 * 1.05);
    CHECK(second[rank_series("ddp_step_time_seconds", rank)] >= 0.02);
    CHECK(second[rank_series("ddp_communication_time_seconds", rank)] >= 0);
    CHECK(second[rank_series("ddp_communication_time_seconds", rank)] < second[rank_series("ddp_step_time_seconds", rank)]);
    CHECK(std::isfinite(second[rank_series("ddp_loss", rank)]));
    CHECK(second[rank_series("ddp_loss", rank)] >= 0);
    const double age = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                       second[rank_series("ddp_last_heartbeat_timestamp_seconds", rank)];
    CHECK(age > -1);
    CHECK(age < 10);
  }
  CHECK(second["ddp_world_size{node_rank=\"0\"}"] == 2);
  CHECK(second["ddp_restarts_total{node_rank=\"0\"}"] == 0);
  CHECK(second["ddp_worker_failures_total{node_rank=\"0\"}"] == 0);
  job.stop();
  CHECK_FALSE(http_get(job.port, "/metrics"));  // the server went with the launcher
}

TEST_CASE("/metrics: a port in use or an address that is not local is refused before any worker starts",
          "[metrics]") {
  TempDir dir;
  const int busy_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(busy_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(busy_fd, 1) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(busy_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string busy = std::to_string(ntohs(addr.sin_port));
  const auto in_use = run_launcher({"--master_port", "0", "--metrics_port", busy, worker_path(), "train", "--pid-dir", dir.path()});
  ::close(busy_fd);
  CHECK(in_use.exit_code == 2);
  CHECK_THAT(in_use.err, Contains("ddp_launch: error: --metrics_port " + busy + " on 127.0.0.1 is already in use"));
  const auto not_local = run_launcher({"--master_port", "0", "--metrics_port", "9", "--metrics_addr", "192.0.2.1",
                                       worker_path(), "train", "--pid-dir", dir.path()});
  CHECK(not_local.exit_code == 2);
  CHECK_THAT(not_local.err, Contains("--metrics_addr 192.0.2.1 is not an address of this machine"));
  CHECK(recorded_pids(dir.path()).empty());  // no worker was started
}

TEST_CASE("/metrics: 8 clients sending a byte a second and 200 idle connections do not delay a scrape past 2 s",
          "[metrics]") {
  MetricsJob job;
  scrape_when_running(job.port);
  double slowest = 0;
  {
    Crowd crowd(job.port, 200, 8);
    REQUIRE(crowd.connected() == 208);
    // Scrapes for 6 s while the crowd holds on (longer than any per-connection timeout of the server).
    for (int i = 0; i < 6; ++i) {
      const auto start = Clock::now();
      const auto body = http_get(job.port, "/metrics", 2s);
      slowest = std::max(slowest, std::chrono::duration<double>(Clock::now() - start).count());
      INFO("scrape " << i << " with the crowd connected");
      REQUIRE(body);
      CHECK_THAT(*body, Contains("ddp_steps_total{rank=\"0\""));
      std::this_thread::sleep_for(1s);
    }
    // The server hangs up on each of them by itself (its per-connection read timeout).
    CHECK(crowd.closed_by_server(10s) == 208);
  }
  // A request header longer than 8 KiB is refused with a status, not left waiting.
  const int big = connect_loopback(job.port);
  REQUIRE(big >= 0);
  const std::string oversized = "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(9000, 'a') + "\r\n\r\n";
  [[maybe_unused]] const ssize_t sent = ::send(big, oversized.data(), oversized.size(), MSG_NOSIGNAL);
  pollfd answer{big, POLLIN, 0};
  char status[32] = {0};
  if (::poll(&answer, 1, 2000) == 1) [[maybe_unused]] const ssize_t got = ::recv(big, status, sizeof status - 1, 0);
  ::close(big);
  CHECK_THAT(std::string(status), Contains("HTTP/1.1 431 "));
  job.stop();
  char slowest_ms[32];
  std::snprintf(slowest_ms, sizeof slowest_ms, "%.1f ms", slowest * 1000);
  report("/metrics with 200 idle connections and 8 clients sending a byte a second",
         std::string("6 scrapes answered, the slowest in ") + slowest_ms + "; the server closed all 208 connections");
}

TEST_CASE("/metrics: more idle connections than the server keeps open cannot lock a scraper out", "[metrics]") {
  MetricsJob job;
  scrape_when_running(job.port);
  {
    Crowd crowd(job.port, 300, 0);  // the server keeps 256: the oldest idle ones make room
    REQUIRE(crowd.connected() == 300);
    for (int i = 0; i < 3; ++i) {
      INFO("scrape " << i << " after 300 idle connections");
      CHECK(http_get(job.port, "/metrics", 2s));
    }
    CHECK(crowd.closed_by_server(10s) == 300);
  }
  job.stop();
}

TEST_CASE("a real Prometheus server scrapes the job and has the series", "[prometheus]") {
  const std::string prometheus = find_prometheus();
  if (prometheus.empty()) {
    WARN("SKIPPED: no prometheus binary (Debian package 'prometheus', installed by scripts/setup.sh)");
    return;
  }
  MetricsJob job;
  scrape_when_running(job.port);
  TempDir prom;
  const int web_port = ddp::launcher::process::pick_free_port("127.0.0.1");
  std::ofstream(prom.path() + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "scrape_configs:\n  - job_name: ddp\n    static_configs:\n      - targets: ['127.0.0.1:" << job.port << "']\n";
  Child server({prometheus, "--config.file=" + prom.path() + "/prometheus.yml", "--storage.tsdb.path=" + prom.path() + "/data",
                "--web.listen-address=127.0.0.1:" + std::to_string(web_port), "--log.level=warn"});
  std::string answer;
  bool arrived = false;
  const auto deadline = Clock::now() + 30s;
  while (!arrived && Clock::now() < deadline) {
    std::this_thread::sleep_for(500ms);
    answer = http_get(web_port, "/api/v1/query?query=ddp_steps_total").value_or("");
    arrived = answer.find("\"status\":\"success\"") != std::string::npos &&
              answer.find("\"rank\":\"0\"") != std::string::npos && answer.find("\"rank\":\"1\"") != std::string::npos;
  }
  INFO("last answer of Prometheus' API: " << answer);
  CHECK(arrived);
  CHECK_THAT(answer, Contains("\"__name__\":\"ddp_steps_total\"") && Contains("\"job\":\"ddp\""));
  server.signal(SIGTERM);
  const auto server_end = server.wait(15s);
  REQUIRE(server_end);
  CHECK(server_end->exit_code == 0);
  job.stop();
}

TEST_CASE("hang watchdog with --max_restarts: the stuck attempt counts as a failure and the job resumes",
          "[watchdog]") {
  TempDir dir;
  const std::string checkpoints = dir.path() + "/ckpt";
  Child launcher(job({"--nproc_per_node", "2", "--hang_timeout", "2", "--shutdown_grace", "2", "--max_restarts", "1"},
                     {"--steps", "6", "--step-ms", "20", "--timeout-ms", "120000", "--checkpoint-dir", checkpoints,
                      "--checkpoint-every", "2", "--resume", "--pid-dir", dir.path()}),
                 fault("rank=1,step=4,kind=hang,attempt=0"));
  const auto finished = launcher.wait(60s);
  REQUIRE(finished);
  const LaunchOutcome& outcome = *finished;
  INFO(outcome.out << outcome.err);
  CHECK(outcome.exit_code == 0);
  CHECK_THAT(outcome.err, Contains("(last heartbeat at step 3; the other ranks are at step 4)") &&
                              Contains("worker group failed (rank 1 exited with SIGTERM") && Contains("restart 1 of 1"));
  CHECK_THAT(outcome.out, Contains("resumed from step 2") && Contains("finished 6 steps"));
  require_gone(recorded_pids(dir.path()));
}
