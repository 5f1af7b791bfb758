// Every launcher feature in every mode (See Note [One node agent] in launcher/agent/agent.cpp): each mode
// runs one job with all the features at once, and each feature's effect is checked on it. The
// table in docs/launcher.md ("Every feature in every mode") is this test.
//   modes: one node; 2 nodes static; 2 nodes c10d; c10d --nnodes 1:2; --recovery live; --hosts
//   features: --hang_timeout (a rank stops heartbeating in attempt 0: named and stopped),
//     --max_restarts (the job goes on after it), --metrics_port with heartbeats (the first
//     launcher's /metrics has its ranks' steps while it runs), --log_dir with --tee (the worker's line in its stdout.log
//     and on the console), --local_ranks_filter, --signals_to_handle, --cpu_bind exclusive,
//     --gpus (an explicit list: CUDA_VISIBLE_DEVICES; NVML's pick is unit-tested with a fake one).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>

#include "ddp/base/str.h"
#include "launcher/process/net.h"
#include "tests/launcher/process_harness.h"

using namespace ddp::launcher;
using namespace ddp::launcher::process;
using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

namespace {

const std::string kFakeSsh = "sh -c 'exec /bin/sh -c \"$2\"' fake_ssh";
const std::string kSignals = "SIGTERM,SIGINT,SIGUSR2";

struct Mode {
  std::string name;
  int nodes = 1;          // launchers started by the test
  int nproc = 1;          // workers per launcher
  // The launcher flags of node k (its metrics port given).
  std::function<std::vector<std::string>(int k, const std::string& metrics_port)> flags;
};

// The body of GET /metrics on 127.0.0.1:port, or "" (no answer within 2 s).
std::string scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    [[maybe_unused]] const ssize_t sent = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    char buf[16384];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      response.append(buf, static_cast<size_t>(n));
    }
  }
  if (fd >= 0) ::close(fd);
  return response;
}

std::vector<Mode> modes() {
  const std::string port = std::to_string(pick_free_port("127.0.0.1"));
  const auto rdzv = [port](const std::string& nnodes, const std::string& id) {
    return std::vector<std::string>{"--nnodes", nnodes, "--rdzv_endpoint", "127.0.0.1:" + port, "--rdzv_id", id,
                                    "--rdzv_timeout", "30", "--rdzv_conf", "last_call_timeout=1"};
  };
  std::vector<Mode> all;
  all.push_back({"one node", 1, 2, [](int, const std::string&) { return std::vector<std::string>{}; }});
  all.push_back({"2 nodes, static", 2, 1, [port](int k, const std::string&) {
                   return std::vector<std::string>{"--nnodes", "2", "--node_rank", std::to_string(k), "--master_addr",
                                                   "127.0.0.1", "--master_port", port};
                 }});
  all.push_back({"2 nodes, c10d", 2, 1, [rdzv](int, const std::string&) { return rdzv("2", "fixed"); }});
  all.push_back({"c10d --nnodes 1:2", 2, 1, [rdzv](int, const std::string&) { return rdzv("1:2", "elastic"); }});
  all.push_back({"--recovery live", 2, 1, [rdzv](int, const std::string&) {
                   auto flags = rdzv("1:2", "live");
                   flags.insert(flags.end(), {"--recovery", "live"});
                   return flags;
                 }});
  all.push_back({"--hosts", 1, 2, [port](int, const std::string&) {
                   return std::vector<std::string>{"--hosts", "a:2", "--ssh_cmd", kFakeSsh, "--master_addr", "127.0.0.1",
                                                   "--master_port", port};
                 }});
  return all;
}

}  // namespace

TEST_CASE("every launcher feature works in every mode", "[process][matrix]") {
  for (const Mode& mode : modes()) {
    INFO("mode: " << mode.name);
    TempDir dir;
    const std::string log_dir = dir.path() + "/logs";
    const std::string out = dir.path() + "/out";
    std::filesystem::create_directories(out);
    const int world = mode.nodes * mode.nproc;
    const int metrics_port = pick_free_port("127.0.0.1");
    std::vector<std::unique_ptr<Child>> launchers;
    for (int k = 0; k < mode.nodes; ++k) {
      // Only the first launcher's /metrics is scraped (the others serve a port of their own).
      const std::string port = std::to_string(k == 0 ? metrics_port : pick_free_port("127.0.0.1"));
      std::vector<std::string> argv{launcher_path(), "--nproc_per_node", std::to_string(mode.nproc),
                                    "--monitor_interval", "0.05", "--shutdown_grace", "2",
                                    "--hang_timeout", "1", "--max_restarts", "1",
                                    "--metrics_port", port, "--log_dir", log_dir, "--tee", "3",
                                    "--local_ranks_filter", "0", "--signals_to_handle", kSignals,
                                    "--cpu_bind", "exclusive", "--gpus", mode.nproc == 2 ? "0,1" : "0"};
      const auto flags = mode.flags(k, port);
      argv.insert(argv.end(), flags.begin(), flags.end());
      // The last rank stops heartbeating before step 3 in its first attempt; every rank prints a line.
      argv.insert(argv.end(), {worker_path(), "--out", out, "--print", "hello from the worker", "--steps", "*:30",
                               "--hang-at", std::to_string(world - 1) + ":3", "--fail-attempts", "1"});
      launchers.push_back(std::make_unique<Child>(argv));
      if (k == 0) std::this_thread::sleep_for(200ms);  // node 0 first (it serves the store or listens)
    }
    // /metrics of the first launcher while the job runs: its ranks' steps (which ranks it runs, the
    // c10d rendezvous decides: node ranks go by the order of joining, not of starting).
    bool saw_steps = false;
    for (auto until = std::chrono::steady_clock::now() + 20s; !saw_steps && std::chrono::steady_clock::now() < until;) {
      saw_steps = scrape(metrics_port).find("ddp_steps_total{rank=\"") != std::string::npos;
      if (!saw_steps) std::this_thread::sleep_for(50ms);
    }
    std::string err, console;
    for (auto& launcher : launchers) {
      const auto outcome = launcher->wait(90s);
      REQUIRE(outcome);
      INFO(outcome->err);
      CHECK(outcome->exit_code == 0);  // --max_restarts: the job went on after the hang
      err += outcome->err;
      console += outcome->out;
    }
    INFO(err);
    CHECK(saw_steps);                                                             // --metrics_port, heartbeats
    CHECK_THAT(err, Catch::Contains(ddp::str("rank ", world - 1, " (pid ")) &&    // --hang_timeout
                        Catch::Contains("made no progress for"));
    CHECK_THAT(err, Catch::Contains("--cpu_bind exclusive: local rank 0: "));      // --cpu_bind
    // Every rank ran again after the hang (the group, a new round, or the hung worker alone).
    CHECK(wait_for_files(out, ddp::str("rank", world - 1, ".attempt1"), 1, 5s));  // --max_restarts
    for (int rank = 0; rank < world; ++rank) {
      const WorkerRecord record = read_record(ddp::str(out, "/rank", rank, ".attempt0"));
      CHECK(record.env.at("TORCHELASTIC_SIGNALS_TO_HANDLE") == kSignals);            // --signals_to_handle
      CHECK(record.env.at("CUDA_VISIBLE_DEVICES") == std::to_string(rank % mode.nproc));  // --gpus
      CHECK(record.env.at("OMP_NUM_THREADS") != "");                                 // --cpu_bind's thread count
    }
    // --tee 3 with --local_ranks_filter 0: local rank 0's line on the console, every rank's in its
    // stdout.log below --log_dir.
    CHECK(count_of(console, ": hello from the worker\n") >= static_cast<size_t>(mode.nodes));
    if (mode.nproc == 2) CHECK(console.find("[rank 1]") == std::string::npos);
    size_t logged = 0;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(log_dir)) {
      if (entry.path().filename() == "stdout.log" && read_text(entry.path().string()).find("hello from the worker") !=
                                                         std::string::npos) {
        ++logged;
      }
    }
    CHECK(logged >= static_cast<size_t>(world));  // --log_dir
  }
}

namespace {

// `curl -s -o BODY -w %{http_code} URL`: a real HTTP client, as Kubernetes' probes are. The status
// (0: no answer) and the body.
std::pair<int, std::string> curl(const std::string& url, const std::string& body_file) {
  const std::string command = "curl -s -m 2 -o '" + body_file + "' -w '%{http_code}' '" + url + "' 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {0, ""};
  char status[16] = {0};
  const size_t n = std::fread(status, 1, sizeof status - 1, pipe);
  ::pclose(pipe);
  status[n] = '\0';
  return {std::atoi(status), read_text(body_file)};
}

}  // namespace

TEST_CASE("/healthz and /readyz answer Kubernetes' probes with 200 or 503", "[process][health]") {
  // See Note [Health endpoints] in launcher/observe/progress_board.h. Rank 1 heartbeats only after
  // 1.5 s: until then the job is alive but not ready.
  if (std::system("curl --version >/dev/null 2>&1") != 0) {
    FAIL("no curl (scripts/setup.sh --test installs it)");
  }
  TempDir dir;
  const int port = pick_free_port("127.0.0.1");
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  Child launcher({launcher_path(), "--nproc_per_node", "2", "--monitor_interval", "0.05", "--metrics_port",
                  std::to_string(port), worker_path(), "--sleep", "1:1.5", "--steps", "*:60"});
  const std::string body = dir.path() + "/body";
  bool alive = false, waited_for_rank1 = false, ready = false;
  for (auto until = std::chrono::steady_clock::now() + 30s; !ready && std::chrono::steady_clock::now() < until;) {
    const auto [health, health_text] = curl(base + "/healthz", body);
    alive = alive || health == 200;
    const auto [readiness, readiness_text] = curl(base + "/readyz", body);
    if (readiness == 503 && readiness_text.find("rank 1 has not heartbeated yet") != std::string::npos) {
      waited_for_rank1 = true;
    }
    ready = readiness == 200;
    if (ready) CHECK(readiness_text == "ready: 2 workers heartbeating\n");
    if (!ready) std::this_thread::sleep_for(50ms);
  }
  CHECK(alive);
  CHECK(waited_for_rank1);
  CHECK(ready);
  CHECK(curl(base + "/healthz", body).first == 200);
  CHECK(curl(base + "/nothing", body).first == 404);
  const auto outcome = launcher.wait(30s);
  REQUIRE(outcome);
  CHECK(outcome->exit_code == 0);
  CHECK(curl(base + "/healthz", body).first == 0);  // gone with the launcher
}
