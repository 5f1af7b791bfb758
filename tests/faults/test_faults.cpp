// Fault injection through the real ddp_launch and real ranks over Gloo on 127.0.0.1 (issue 6):
// a rank that dies or hangs, the launcher killed or signalled, restarts that resume bit for bit,
// checkpoints cut short or corrupted, rendezvous that cannot happen. fault_worker.cpp injects the
// fault (DDP_FAULT) and records every rank's pid, so that each test checks in /proc that no process
// of the job survives. Lines "fault-matrix: ..." give the figures of docs/faults.md.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/faults/fault_job.h"
#include "tests/launcher/process_harness.h"

namespace fs = std::filesystem;
using namespace ddp::launcher::testing;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

// Waits (bounded) until the launcher has started `count` ranks and they recorded their pids.
std::vector<int> wait_for_ranks(const std::string& dir, size_t count) {
  REQUIRE(wait_for_files(dir, "rank", count, 30s));
  std::this_thread::sleep_for(50ms);  // the pid is written right after the file is created
  return recorded_pids(dir);
}

// The root cause's message in the launcher's failure summary ("" if none).
std::string summary_message(const std::string& err) {
  const std::string label = "message   : ";
  const auto at = err.find(label);
  if (at == std::string::npos) return "";
  return err.substr(at + label.size(), err.find('\n', at) - at - label.size());
}

// The first line of text that contains needle ("" if none).
std::string line_containing(const std::string& text, const std::string& needle) {
  const auto at = text.find(needle);
  if (at == std::string::npos) return "";
  const auto begin = text.rfind('\n', at);
  const auto from = begin == std::string::npos ? 0 : begin + 1;
  return text.substr(from, text.find('\n', at) - from);
}

// Runs `fault_worker verify DIR` (no process group) and returns its output.
LaunchOutcome verify(const std::string& checkpoints) {
  Child child({worker_path(), "verify", checkpoints});
  auto outcome = child.wait(30s);
  REQUIRE(outcome);
  return *outcome;
}

// A TCP socket listening on 127.0.0.1 on a free port (closed at the end of the test).
struct Listener {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  Listener() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port = ntohs(addr.sin_port);
  }
  ~Listener() { ::close(fd); }
};

// A port nothing listens on (bound and closed again).
int closed_port() {
  Listener l;
  return l.port;
}

}  // namespace

TEST_CASE("a rank that exits, segfaults or is SIGKILLed takes the whole job down; the summary names it",
          "[crash]") {
  struct Case {
    std::string kind;
    int exit_code;
    std::string exitcode_line;
  };
  for (const Case& c : {Case{"exit", 3, "exitcode  : 3"}, Case{"segv", 128 + SIGSEGV, "SIGSEGV"},
                        Case{"sigkill", 128 + SIGKILL, "SIGKILL"}}) {
    DYNAMIC_SECTION(c.kind) {
      const int step = 2 + static_cast<int>(std::random_device{}() % 7);  // a random step, 2..8
      INFO("fault at step " << step);
      TempDir dir;
      Child launcher(job({"--nproc_per_node", "3", "--shutdown_grace", "5"},
                         {"--steps", "100000", "--step-ms", "20", "--pid-dir", dir.path()}),
                     fault_in("rank=1,step=" + std::to_string(step) + ",kind=" + c.kind, dir.path()));
      const auto outcome = launcher.wait(60s);
      const auto end = Clock::now();
      REQUIRE(outcome);
      INFO(outcome->err);
      CHECK(outcome->exit_code == c.exit_code);
      CHECK_THAT(outcome->err, Contains("worker group FAILED"));
      CHECK_THAT(outcome->err, Contains("rank      : 1 (local_rank: 1)"));
      CHECK_THAT(outcome->err, Contains(c.exitcode_line));
      const auto pids = recorded_pids(dir.path());
      CHECK(pids.size() == 3);
      require_gone(pids);
      const double seconds = seconds_since_fault(dir.path(), end);
      CHECK(seconds < 5 + 2);  // within the grace period (plus the launcher's own bounded drain)
      report("rank 1 " + c.kind + " at step " + std::to_string(step) + " (3 ranks)",
             "exit " + std::to_string(outcome->exit_code) + ", all ranks gone " + fmt_seconds(seconds) + " after the fault");
    }
  }
}

TEST_CASE("the launcher SIGKILLed mid-training leaves no worker behind", "[launcher_kill]") {
  TempDir dir;
  // TMPDIR: a SIGKILLed launcher cannot remove its temporary folder (for the error files); TempDir does.
  Child launcher(job({"--nproc_per_node", "2"}, {"--steps", "100000", "--step-ms", "20", "--pid-dir", dir.path()}),
                 {{"TMPDIR", dir.path()}});
  const auto pids = wait_for_ranks(dir.path(), 2);
  std::this_thread::sleep_for(500ms);  // training
  for (const int pid : pids) REQUIRE(process_alive(pid));
  const auto kill_time = Clock::now();
  launcher.signal(SIGKILL);
  REQUIRE(launcher.wait(10s));
  require_gone(pids);  // PR_SET_PDEATHSIG
  report("launcher SIGKILLed (2 ranks)", "all ranks gone " +
                                             fmt_seconds(std::chrono::duration<double>(Clock::now() - kill_time).count()) +
                                             " after the kill");
}

TEST_CASE("SIGINT or SIGTERM to the launcher stops the workers; the last checkpoint is intact", "[signals]") {
  for (const int sig : {SIGINT, SIGTERM}) {
    DYNAMIC_SECTION("signal " << sig) {
      TempDir dir;
      const std::string checkpoints = dir.path() + "/ckpt";
      Child launcher(job({"--nproc_per_node", "2", "--shutdown_grace", "5"},
                         {"--steps", "100000", "--step-ms", "30", "--checkpoint-dir", checkpoints, "--pid-dir",
                          dir.path()}));
      const auto pids = wait_for_ranks(dir.path(), 2);
      REQUIRE(wait_for_files(checkpoints, "step-", 3, 30s));  // mid-training, checkpoints being written
      const auto signal_time = Clock::now();
      launcher.signal(sig);
      const auto outcome = launcher.wait(30s);
      const double seconds = std::chrono::duration<double>(Clock::now() - signal_time).count();
      REQUIRE(outcome);
      INFO(outcome->err);
      CHECK(outcome->exit_code == 128 + sig);
      require_gone(pids);
      CHECK(seconds < 5 + 2);
      const auto check = verify(checkpoints);
      INFO(check.out << check.err);
      CHECK(check.exit_code == 0);
      REQUIRE_THAT(check.out, Contains("latest valid checkpoint: step "));
      // Steps 1..3 were complete before the signal; a checkpoint being written then does not count.
      CHECK(std::stoi(check.out.substr(check.out.find("step ") + 5)) >= 3);
      report(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + " to the launcher (2 ranks)",
             "exit " + std::to_string(outcome->exit_code) + ", all ranks gone " + fmt_seconds(seconds) +
                 " after the signal; " + check.out.substr(0, check.out.find('\n')));
    }
  }
}

namespace {

// Rank 1 of 2 hangs (DDP_FAULT kind) at step 3; the process group's timeout is 2 s. Returns the
// launcher's outcome and the seconds from the hang to a clean exit (every rank gone).
std::pair<LaunchOutcome, double> run_hung_job(const std::string& kind, const std::string& grace) {
  TempDir dir;
  // TMPDIR: without --log_dir, the timed-out rank's collectives-rank0.json goes next to its error
  // file, in the launcher's temporary folder, which the launcher then keeps for the user.
  const Env env = fault_in("rank=1,step=3,kind=" + kind, dir.path());
  Child launcher(job({"--nproc_per_node", "2", "--shutdown_grace", grace},
                     {"--steps", "100000", "--step-ms", "20", "--timeout-ms", "2000", "--pid-dir", dir.path()}),
                 env);
  const auto outcome = launcher.wait(60s);
  const auto end = Clock::now();
  REQUIRE(outcome);
  require_gone(recorded_pids(dir.path()));
  // The message points to rank 0's ring buffer file, and the launcher kept it.
  const std::string message = summary_message(outcome->err);
  const std::string label = "last collectives: ";
  const auto at = message.find(label);
  INFO(outcome->err);
  REQUIRE(at != std::string::npos);
  const std::string ring = message.substr(at + label.size(), message.rfind(']') - at - label.size());
  CHECK(ring.rfind(dir.path() + "/", 0) == 0);
  CHECK(fs::path(ring).filename() == "collectives-rank0.json");
  CHECK(fs::exists(ring));
  CHECK_THAT(outcome->err, Contains("worker logs are in " + dir.path()));
  return {*outcome, seconds_since_fault(dir.path(), end)};
}

}  // namespace

TEST_CASE("a rank that hangs in a step: the collective timeout fires on the others, the job ends",
          "[hang]") {
  SECTION("the hung rank stops on SIGTERM") {
    const auto [outcome, seconds] = run_hung_job("hang", "3");
    INFO(outcome.out << outcome.err);
    CHECK(outcome.exit_code == 1);
    // Rank 0 is the root cause: its collective timed out (its message is in the summary).
    CHECK_THAT(outcome.err, Contains("rank      : 0 (local_rank: 0)"));
    // The hung rank did not stop by itself: the launcher stopped it.
    CHECK_THAT(outcome.err, Contains("rank 1 (local_rank: 1): exitcode SIGTERM") &&
                                Contains("(after the launcher stopped the group)"));
    const std::string message = summary_message(outcome.err);
    // See Note [Naming the ranks that did not arrive]: rank 0 names the hung rank.
    CHECK_THAT(message, Contains("gradient all-reduce #") && Contains("timed out after 2 s on rank 0") &&
                            Contains("rank(s) 1 did not arrive"));
    CHECK(seconds < 2 + 2 + 3 + 5);  // timeout + report window + grace + slack
    report("rank 1 hangs at step 3, --timeout-ms 2000 (2 ranks)",
           "exit 1, all ranks gone " + fmt_seconds(seconds) + " after the hang began; rank 0 says: " + message);
  }
  SECTION("the hung rank ignores SIGTERM: SIGKILL after --shutdown_grace") {
    const auto [outcome, seconds] = run_hung_job("hang_noterm", "2");
    INFO(outcome.out << outcome.err);
    CHECK(outcome.exit_code == 1);
    CHECK_THAT(outcome.err, Contains("rank      : 0 (local_rank: 0)"));
    CHECK_THAT(outcome.err, Contains("rank 1 (local_rank: 1): exitcode SIGKILL"));
    CHECK_THAT(summary_message(outcome.err), Contains("rank(s) 1 did not arrive"));
    CHECK(seconds < 2 + 2 + 2 + 5);  // timeout + report window + grace + slack
    report("rank 1 hangs at step 3 ignoring SIGTERM, --timeout-ms 2000, --shutdown_grace 2 (2 ranks)",
           "exit 1, the hung rank SIGKILLed after the grace period; all ranks gone " + fmt_seconds(seconds) +
               " after the hang began");
  }
}

TEST_CASE("--max_restarts: a crash at a step, the restart resumes from the last checkpoint, bit for bit",
          "[restart]") {
  TempDir dir;
  const std::vector<std::string> common{"--steps", "12", "--checkpoint-every", "2", "--resume"};
  auto with = [&](std::vector<std::string> args, const std::string& name) {
    args.insert(args.end(), common.begin(), common.end());
    for (const std::string flag : {"--checkpoint-dir", "--save-params"}) {
      args.push_back(flag);
      args.push_back(dir.path() + "/" + name + (flag == std::string("--save-params") ? ".bin" : ""));
    }
    return args;
  };
  Child reference(job({"--nproc_per_node", "2"}, with({}, "reference")));
  const auto ref = reference.wait(60s);
  REQUIRE(ref);
  INFO(ref->out << ref->err);
  REQUIRE(ref->exit_code == 0);

  Child crashed(job({"--nproc_per_node", "2", "--max_restarts", "1", "--shutdown_grace", "5"},
                    with({"--pid-dir", dir.path()}, "restarted")),
                fault_in("rank=1,step=8,kind=exit", dir.path()));
  const auto run = crashed.wait(60s);
  REQUIRE(run);
  INFO(run->out << run->err);
  REQUIRE(run->exit_code == 0);
  CHECK_THAT(run->err, Contains("restart 1 of 1"));
  CHECK_THAT(run->out, Contains("[rank 1]: resumed from step 6"));
  CHECK_THAT(run->out, Contains("[rank 0]: resumed from step 6"));
  CHECK(recorded_pids(dir.path()).size() == 4);  // two attempts of two ranks
  require_gone(recorded_pids(dir.path()));

  const std::string expected = read_text(dir.path() + "/reference.bin");
  const std::string got = read_text(dir.path() + "/restarted.bin");
  CHECK(expected.size() == (8 * 16 + 16 + 16 + 1) * sizeof(double));
  CHECK(got == expected);  // bit for bit
  report("rank 1 exits at step 8, --max_restarts 1 (2 ranks, checkpoint every 2 steps)",
         "restart resumed from step 6; final parameters equal the uninterrupted run's bit for bit; launcher exit 0");
}

TEST_CASE("a rank killed while writing a checkpoint leaves the previous one; a corrupt newest is skipped",
          "[checkpoint]") {
  TempDir dir;
  const std::string checkpoints = dir.path() + "/ckpt";
  Child launcher(job({"--nproc_per_node", "2", "--shutdown_grace", "3"},
                     {"--steps", "100", "--checkpoint-dir", checkpoints, "--pid-dir", dir.path()}),
                 fault_in("rank=0,step=4,kind=ckpt", dir.path()));
  const auto outcome = launcher.wait(60s);
  REQUIRE(outcome);
  INFO(outcome->out << outcome->err);
  CHECK(outcome->exit_code == 128 + SIGKILL);
  CHECK_THAT(outcome->out, Contains("killed while writing a checkpoint"));
  require_gone(recorded_pids(dir.path()));
  const double seconds = seconds_since_fault(dir.path(), Clock::now());
  // The half-written step 4 is a leftover temporary folder; step 3 is the newest and verifies.
  bool leftover = false;
  for (const auto& name : list_dir(checkpoints)) leftover = leftover || name.find("tmp") != std::string::npos;
  CHECK(leftover);
  auto check = verify(checkpoints);
  CHECK(check.exit_code == 0);
  CHECK_THAT(check.out, Contains("latest valid checkpoint: step 3"));

  // Corrupt the newest (step 3): it is reported, and --resume continues from step 2.
  const std::string model = checkpoints + "/step-000000000003/model.pt";
  REQUIRE(fs::exists(model));
  fs::resize_file(model, fs::file_size(model) / 2);
  check = verify(checkpoints);
  CHECK_THAT(check.out, Contains("latest valid checkpoint: step 2"));
  Child resumed(job({"--nproc_per_node", "2"}, {"--steps", "5", "--checkpoint-dir", checkpoints, "--resume"}));
  const auto resume = resumed.wait(60s);
  REQUIRE(resume);
  INFO(resume->out << resume->err);
  CHECK(resume->exit_code == 0);
  CHECK_THAT(resume->out + resume->err, Contains("skipping checkpoint") && Contains("step-000000000003"));
  CHECK_THAT(resume->out, Contains("[rank 1]: resumed from step 2"));
  CHECK_THAT(resume->out, Contains("finished 5 steps"));
  report("rank 0 SIGKILLed while writing checkpoint step 4 (2 ranks)",
         "exit " + std::to_string(outcome->exit_code) + ", all ranks gone " + fmt_seconds(seconds) +
             "; step 3 verifies; with step 3 corrupted, --resume reports it and resumes from step 2");
}

TEST_CASE("rendezvous that cannot happen: a clear error within the configured timeout", "[rendezvous]") {
  SECTION("master port in use") {
    Listener busy;
    const auto start = Clock::now();
    const auto outcome = run_launcher({"--nproc_per_node", "2", "--master_port", std::to_string(busy.port),
                                       worker_path(), "train"},
                                      {}, 30s);
    CHECK(outcome.exit_code == 2);
    CHECK_THAT(outcome.err, Contains("already in use"));
    report("master port in use", "exit 2 after " +
                                     fmt_seconds(std::chrono::duration<double>(Clock::now() - start).count()) +
                                     ": " + outcome.err.substr(0, outcome.err.find('\n')));
  }
  SECTION("master unreachable") {
    // Node 0's launcher never comes: node 1's launcher waits for its welcome (the static
    // rendezvous: See Note [One port per job]) within --rdzv_timeout, and starts no worker.
    TempDir dir;
    const int port = closed_port();
    Child launcher({launcher_path(), "--nnodes", "2", "--node_rank", "1", "--master_port", std::to_string(port),
                    "--rdzv_timeout", "3", "--nproc_per_node", "1", worker_path(), "train", "--pid-dir", dir.path()});
    const auto outcome = launcher.wait(60s);
    REQUIRE(outcome);
    INFO(outcome->out << outcome->err);
    CHECK(outcome->exit_code == 1);
    CHECK_THAT(outcome->err, Contains("could not reach node 0's launcher at 127.0.0.1:" + std::to_string(port) +
                                      " within 3 s (--rdzv_timeout)"));
    CHECK(recorded_pids(dir.path()).empty());
    CHECK(outcome->seconds < 3 + 10);
    report("master unreachable (node 1 of 2, --rdzv_timeout 3)",
           "exit 1 after " + fmt_seconds(outcome->seconds) + ": " + outcome->err.substr(0, outcome->err.find('\n')));
  }
  SECTION("a node that never joins (static)") {
    TempDir dir;
    Child launcher({launcher_path(), "--nnodes", "2", "--node_rank", "0", "--master_port",
                    std::to_string(closed_port()), "--nproc_per_node", "1", worker_path(), "train", "--timeout-ms",
                    "3000", "--pid-dir", dir.path()});
    const auto outcome = launcher.wait(60s);
    REQUIRE(outcome);
    INFO(outcome->out << outcome->err);
    CHECK(outcome->exit_code == 1);
    CHECK_THAT(summary_message(outcome->err), Contains("waited 3 s for rank 1 to join"));
    require_gone(recorded_pids(dir.path()));
    CHECK(outcome->seconds < 3 + 10);
    report("node 1 of 2 never joins (static, --timeout-ms 3000)",
           "exit 1 after " + fmt_seconds(outcome->seconds) + ": " + summary_message(outcome->err));
  }
  SECTION("a node that never joins (--rdzv_endpoint)") {
    const auto outcome = run_launcher({"--nnodes", "2", "--nproc_per_node", "1", "--rdzv_endpoint",
                                       "127.0.0.1:" + std::to_string(closed_port()), "--rdzv_id", "faults",
                                       "--rdzv_timeout", "2", "/bin/true"},
                                      {}, 30s);
    CHECK(outcome.exit_code == 1);
    CHECK_THAT(outcome.err, Contains("timed out after 2 s") && Contains("1 of 2 nodes joined"));
    CHECK(outcome.seconds < 2 + 10);
    report("node 1 of 2 never joins (--rdzv_endpoint, --rdzv_timeout 2)",
           "exit 1 after " + fmt_seconds(outcome.seconds) + ": " + line_containing(outcome.err, "timed out after"));
  }
}

namespace {

// The "collectives" array of a ring buffer file, and its header's last_seq.
struct RingFile {
  std::int64_t last_seq = 0;
  std::vector<nlohmann::json> collectives;
};

RingFile read_ring_file(const std::string& path) {
  const std::string text = read_text(path);
  INFO(path << ":\n" << text);
  const auto root = nlohmann::json::parse(text, nullptr, false);
  REQUIRE(root.is_object());
  REQUIRE(root.contains("last_seq"));
  REQUIRE(root.contains("collectives"));
  return {root.at("last_seq").get<std::int64_t>(), root.at("collectives").get<std::vector<nlohmann::json>>()};
}

// A field as text: a string's value, a number's literal.
std::string text_of(const nlohmann::json& item, const std::string& key) {
  const auto value = item.find(key);
  if (value == item.end()) return "<missing>";
  return value->is_string() ? value->get<std::string>() : value->dump();
}

// nproc ranks of fault_worker with --log_dir logs and --run_id run_id, process group timeout 2 s.
std::vector<std::string> logged_job(int nproc, const std::string& logs, const std::string& run_id,
                                    const std::string& pid_dir) {
  return job({"--nproc_per_node", std::to_string(nproc), "--shutdown_grace", "3", "--log_dir", logs, "--run_id", run_id},
             {"--steps", "100000", "--step-ms", "20", "--timeout-ms", "2000", "--pid-dir", pid_dir});
}

}  // namespace

TEST_CASE("a hung rank is named by the ranks that timed out, which write their last collectives", "[diag]") {
  TempDir dir;
  const std::string logs = dir.path() + "/logs";
  Child launcher(logged_job(3, logs, "diag", dir.path()), fault("rank=1,step=4,kind=hang"));
  const auto outcome = launcher.wait(60s);
  const auto end = Clock::now();
  REQUIRE(outcome);
  INFO(outcome->out << outcome->err);
  CHECK(outcome->exit_code == 1);
  require_gone(recorded_pids(dir.path()));
  const std::string message = summary_message(outcome->err);
  // "within 2 s" normally; a rank that timed out over kArrivalLingerSlack later than rank 0 (the
  // store's host) says for how long the store answered it instead. Either way rank 1 is named.
  CHECK_THAT(message, Contains("rank(s) 1 did not arrive (rank 1 sent no report within ") &&
                          Contains(": not inside any collective of this group"));

  // Ranks 0 and 2 timed out in the same collective: both wrote their ring buffer, the hung rank none.
  const std::string attempt = run_folder(logs, "diag") + "/attempt_0/";
  CHECK_FALSE(fs::exists(attempt + "collectives-rank1.json"));
  std::vector<std::int64_t> last;
  for (const int rank : {0, 2}) {
    const RingFile ring = read_ring_file(attempt + "collectives-rank" + std::to_string(rank) + ".json");
    REQUIRE_FALSE(ring.collectives.empty());
    const nlohmann::json& failed = ring.collectives.back();
    CHECK(text_of(failed, "seq") == std::to_string(ring.last_seq));
    CHECK(text_of(failed, "state") == "failed");
    CHECK(text_of(failed, "what") == "gradient all-reduce");
    CHECK(text_of(failed, "op") == "allreduce");
    CHECK(text_of(failed, "dtype") == "Double");
    // Before it: the construction's collectives and 3 completed steps, in sequence.
    CHECK(ring.collectives.size() >= 4);
    for (std::size_t i = 0; i + 1 < ring.collectives.size(); ++i) {
      CHECK(std::stoll(text_of(ring.collectives[i], "seq")) + 1 == std::stoll(text_of(ring.collectives[i + 1], "seq")));
      CHECK(text_of(ring.collectives[i], "state") == "completed");
    }
    last.push_back(ring.last_seq);
  }
  CHECK(last[0] == last[1]);  // the same collective on both ranks
  CHECK_THAT(message, Contains("#" + std::to_string(last[0]) + " "));
  CHECK_THAT(message, Contains("#" + std::to_string(last[0] - 1) + " was the last to complete here"));
  report("rank 1 of 3 hangs at step 4, --timeout-ms 2000, --log_dir", "exit 1, all ranks gone " +
                                                                      fmt_seconds(seconds_since_fault(dir.path(), end)) +
                                                                      " after the hang began; ranks 0 and 2 wrote "
                                                                      "collectives-rank{0,2}.json, last seq " +
                                                                      std::to_string(last[0]) + "; rank 0 says: " + message);
}

TEST_CASE("a desync (one rank issues an extra collective) is named, and the ring buffer files show it", "[diag]") {
  TempDir dir;
  const std::string logs = dir.path() + "/logs";
  Child launcher(logged_job(2, logs, "desync", dir.path()), fault("rank=1,step=4,kind=desync"));
  const auto outcome = launcher.wait(60s);
  REQUIRE(outcome);
  INFO(outcome->out << outcome->err);
  CHECK(outcome->exit_code == 1);
  require_gone(recorded_pids(dir.path()));
  const std::string message = summary_message(outcome->err);
  CHECK_THAT(message, Contains("under the same number") && Contains("a desync"));
  // The same last sequence number on both ranks, but not the same collective.
  const std::string attempt = run_folder(logs, "desync") + "/attempt_0/";
  const RingFile rank0 = read_ring_file(attempt + "collectives-rank0.json");
  const RingFile rank1 = read_ring_file(attempt + "collectives-rank1.json");
  CHECK(rank0.last_seq == rank1.last_seq);
  REQUIRE_FALSE(rank0.collectives.empty());
  REQUIRE_FALSE(rank1.collectives.empty());
  CHECK(text_of(rank0.collectives.back(), "what") == "gradient all-reduce");
  CHECK(text_of(rank1.collectives.back(), "what") == "barrier");
  CHECK(text_of(rank1.collectives.back(), "state") == "failed");
  report("rank 1 of 2 issues an extra barrier before step 4, --timeout-ms 2000, --log_dir",
         "exit 1 after " + fmt_seconds(outcome->seconds) + "; last seq " + std::to_string(rank0.last_seq) +
             " is gradient all-reduce in collectives-rank0.json, barrier in collectives-rank1.json; root cause says: " +
             message);
}

namespace {

// One node of a static 2-node job on 127.0.0.1 (2 workers per node), checkpointing rank 0's model.
std::vector<std::string> node_job(int node_rank, int port, const std::string& dir) {
  return {launcher_path(), "--nnodes", "2", "--node_rank", std::to_string(node_rank), "--master_addr", "127.0.0.1",
          "--master_port", std::to_string(port), "--nproc_per_node", "2", "--monitor_interval", "0.05",
          "--shutdown_grace", "3", worker_path(), "train", "--steps", "100000", "--step-ms", "20", "--timeout-ms",
          "20000", "--checkpoint-dir", dir + "/ckpt", "--checkpoint-every", "5", "--pid-dir", dir};
}

}  // namespace

TEST_CASE("multi-node: a SIGKILLed launcher takes its workers along, the other node's job fails out",
          "[multinode_kill]") {
  for (const std::string victim : {"node 0", "node 1", "both"}) {
    DYNAMIC_SECTION(victim) {
      TempDir dir;
      const int port = closed_port();
      // TMPDIR: a SIGKILLed launcher cannot remove its temporary folder; TempDir does.
      Child node0(node_job(0, port, dir.path()), {{"TMPDIR", dir.path()}});
      Child node1(node_job(1, port, dir.path()), {{"TMPDIR", dir.path()}});
      const auto pids = wait_for_ranks(dir.path(), 4);
      REQUIRE(pids.size() == 4);
      REQUIRE(wait_for_files(dir.path() + "/ckpt", "step-", 2, 30s));  // training: two checkpoints written
      for (const int pid : pids) REQUIRE(process_alive(pid));
      const auto kill_time = Clock::now();
      // Both at once: this process may be preempted between two kill() calls (a loaded machine) long
      // enough for the second launcher to see the first one gone and end the job itself (exit 143,
      // not 137). Stopped first, neither sees the other die.
      if (victim == "both") {
        node0.signal(SIGSTOP);
        node1.signal(SIGSTOP);
      }
      if (victim != "node 1") node0.signal(SIGKILL);
      if (victim != "node 0") node1.signal(SIGKILL);
      const auto out0 = node0.wait(30s);
      const auto out1 = node1.wait(30s);
      REQUIRE(out0);
      REQUIRE(out1);
      const double launchers_s = std::chrono::duration<double>(Clock::now() - kill_time).count();
      INFO("node 0: " << out0->err << "\nnode 1: " << out1->err);
      require_gone(pids);  // PR_SET_PDEATHSIG on the victim's node; a failed collective on the other
      const double gone_s = std::chrono::duration<double>(Clock::now() - kill_time).count();
      CHECK(gone_s < 3 + 5);  // the survivor's grace period plus slack, far below the 20 s timeout
      std::string survivor;
      for (const auto* out : {&*out0, &*out1}) {
        const bool killed = (out == &*out0) ? victim != "node 1" : victim != "node 0";
        if (killed) {
          CHECK(out->exit_code == 128 + SIGKILL);
        } else {
          CHECK(out->exit_code != 0);
          CHECK_THAT(out->err, Contains("worker group FAILED"));
          survivor = " exit " + std::to_string(out->exit_code) + ": " + summary_message(out->err);
        }
      }
      report("launcher of " + victim + " SIGKILLed (2 nodes x 2 ranks)",
             "every worker of both nodes gone " + fmt_seconds(gone_s) + " after the kill (launchers done after " +
                 fmt_seconds(launchers_s) + ")" + (survivor.empty() ? "" : "; the other launcher:" + survivor));
    }
  }
}
