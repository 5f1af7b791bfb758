// Process tests of what ddp_launch trusts (issue 21): log folders another user prepared, stale error
// files, the rendezvous store's address, foreign clients of the store, and c10d's error output.
// See Note [Log folders] (launcher/process/log_layout.cpp) and see Note [Rendezvous token] (launcher/rendezvous/records.cpp).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "ddp/base/str.h"
#include "launcher/process/net.h"
#include "tests/launcher/process_harness.h"

using namespace ddp::launcher;
using namespace ddp::launcher::process;
using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

namespace {

// A file only root can read (0600) with known contents: what a planted link points at.
struct Victim {
  std::string path;
  explicit Victim(const std::string& dir) : path(dir + "/victim") {
    std::ofstream(path) << "secret\n";
    ::chmod(path.c_str(), 0600);
  }
  void check_unchanged() const {
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0600);
    CHECK(read_text(path) == "secret\n");
  }
};

// Plants links to `target` at every file of the fixed paths of earlier versions and of a guess at this run's.
void plant_links(const std::string& dir, const std::string& target) {
  REQUIRE(std::system(("mkdir -p '" + dir + "'").c_str()) == 0);
  for (const char* name : {"stdout.log", "stderr.log", "error.json"}) {
    REQUIRE(::symlink(target.c_str(), (dir + "/" + name).c_str()) == 0);
  }
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// A worker that prints a line; the last rank then fails, writing an error file in its first attempt
// when `message` is not empty.
std::vector<std::string> failing_worker(const std::string& message) {
  return {"/bin/sh", "-c",
          "echo out-$RANK; echo err-$RANK >&2; [ $RANK = $((WORLD_SIZE - 1)) ] || exit 0; sleep 0.2; "
          "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ -n '" + message + "' ]; then "
          "printf '{\"message\": \"%s\"}' '" + message + "' > \"$TORCHELASTIC_ERROR_FILE\"; fi; exit 3"};
}

std::vector<std::string> args(std::vector<std::string> launcher, const std::vector<std::string>& worker) {
  launcher.insert(launcher.end(), worker.begin(), worker.end());
  return launcher;
}

bool is_root() { return ::geteuid() == 0; }

}  // namespace

TEST_CASE("--log_dir: each run its own new 0700 folder; planted links are never followed", "[process][trust]") {
  TempDir dir;
  const Victim victim(dir.path());
  const std::string logs = dir.path() + "/logs";
  // Links where earlier versions wrote (DIR/<run id>/attempt_0/<rank>/...).
  plant_links(logs + "/myrun/attempt_0/0", victim.path);
  plant_links(logs + "/myrun/attempt_0/1", victim.path);
  const auto first = run_launcher(args({"--nproc_per_node", "2", "--master_port", "0", "--log_dir", logs, "--run_id",
                                        "myrun"},
                                       failing_worker("first run fails")),
                                  {}, 30s);
  INFO(first.err);
  CHECK(first.exit_code == 3);
  victim.check_unchanged();
  const std::string run1 = run_folder(logs, "myrun");
  CHECK(mode_of(run1) == 0700);
  CHECK_THAT(first.err, Catch::Contains("logs of this run: " + run1));  // the console says where
  CHECK(read_text(run1 + "/attempt_0/1/stdout.log") == "out-1\n");
  CHECK(mode_of(run1 + "/attempt_0/1/stdout.log") == 0600);
  CHECK_THAT(read_text(run1 + "/attempt_0/1/error.json"), Catch::Contains("first run fails"));

  // The same --log_dir and run id again: a second folder, the first run's logs kept, and this run's
  // failure (no error file) is not reported with the first run's message.
  const auto second = run_launcher(args({"--nproc_per_node", "2", "--master_port", "0", "--log_dir", logs, "--run_id",
                                         "myrun"},
                                        failing_worker("")),
                                   {}, 30s);
  INFO(second.err);
  CHECK(second.exit_code == 3);
  CHECK(second.err.find("first run fails") == std::string::npos);
  CHECK_THAT(second.err, Catch::Contains("message   : <the worker wrote no error file"));
  const auto runs = run_folders(logs, "myrun");
  REQUIRE(runs.size() == 2);
  for (const auto& run : runs) CHECK(read_text(run + "/attempt_0/0/stdout.log") == "out-0\n");
  CHECK_THAT(read_text(run1 + "/attempt_0/1/error.json"), Catch::Contains("first run fails"));
  victim.check_unchanged();
}

TEST_CASE("a restart never reports the previous attempt's error file", "[process][trust]") {
  TempDir dir;
  const auto outcome = run_launcher(args({"--nproc_per_node", "1", "--master_port", "0", "--max_restarts", "1",
                                          "--log_dir", dir.path() + "/logs"},
                                         failing_worker("attempt zero message")),
                                    {}, 30s);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 3);
  CHECK_THAT(outcome.err, Catch::Contains("FAILED after 2 attempts"));
  CHECK_THAT(outcome.err, Catch::Contains("message   : <the worker wrote no error file"));
  CHECK(outcome.err.find("attempt zero message") == std::string::npos);
}

TEST_CASE("--log_dir that another user could rearrange is refused before anything starts", "[process][trust]") {
  TempDir dir;
  const std::string marker = dir.path() + "/started";
  const std::vector<std::string> worker{"/bin/sh", "-c", "touch " + marker};
  const std::string open_dir = dir.path() + "/open";
  REQUIRE(::mkdir(open_dir.c_str(), 0777) == 0);
  REQUIRE(::chmod(open_dir.c_str(), 0777) == 0);  // writable by all, not sticky
  auto outcome = run_launcher(args({"--master_port", "0", "--log_dir", open_dir}, worker), {}, 10s);
  CHECK(outcome.exit_code == 2);
  CHECK(std::count(outcome.err.begin(), outcome.err.end(), '\n') == 1);
  CHECK_THAT(outcome.err, Catch::Contains("writable by other users and not sticky"));
  CHECK(list_dir(open_dir).empty());
  CHECK(::access(marker.c_str(), F_OK) != 0);  // nothing started
  // Sticky (like /tmp): accepted.
  REQUIRE(::chmod(open_dir.c_str(), 01777) == 0);
  outcome = run_launcher(args({"--master_port", "0", "--log_dir", open_dir, "--run_id", "ok"}, worker), {}, 10s);
  CHECK(outcome.exit_code == 0);
  CHECK(run_folders(open_dir, "ok").size() == 1);
  CHECK(::unlink(marker.c_str()) == 0);
  if (is_root()) {  // a folder of another user: refused
    const std::string theirs = dir.path() + "/theirs";
    REQUIRE(::mkdir(theirs.c_str(), 0755) == 0);
    REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
    outcome = run_launcher(args({"--master_port", "0", "--log_dir", theirs}, worker), {}, 10s);
    CHECK(outcome.exit_code == 2);
    CHECK_THAT(outcome.err, Catch::Contains("belongs to user 65534"));
    CHECK(list_dir(theirs).empty());
    CHECK(::access(marker.c_str(), F_OK) != 0);
  }
}

TEST_CASE("another user's links in a sticky shared folder: a root job's logs never go through them",
          "[process][trust]") {
  if (!is_root() || ::access("/usr/bin/setpriv", X_OK) != 0) {
    SUCCEED("needs root and setpriv to act as another user; skipped");
    return;
  }
  TempDir dir;
  REQUIRE(::chmod(dir.path().c_str(), 0711) == 0);  // the other user may pass through, not list
  const Victim victim(dir.path());
  const std::string shared = dir.path() + "/shared";
  REQUIRE(::mkdir(shared.c_str(), 01777) == 0);
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);
  // User 65534 plants links at the paths of earlier versions and makes a --log_dir of its own.
  const std::string plant =
      "set -e; cd '" + shared + "'; for r in 0 1; do mkdir -p job/attempt_0/$r; "
      "for f in stdout.log stderr.log error.json; do ln -s '" + victim.path + "' job/attempt_0/$r/$f; done; done; "
      "mkdir theirs; ln -s '" + victim.path + "' theirs/job";
  const auto planted = run_launcher({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                     "/bin/sh", "-c", plant},
                                    {}, 10s);
  INFO(planted.err);
  REQUIRE(planted.exit_code == 0);
  const auto outcome = run_launcher(args({"--nproc_per_node", "2", "--master_port", "0", "--log_dir", shared,
                                          "--run_id", "job"},
                                         failing_worker("root job failure")),
                                    {}, 30s);
  INFO(outcome.err);
  CHECK(outcome.exit_code == 3);
  victim.check_unchanged();
  const std::string run = run_folder(shared, "job");
  struct stat st {};
  REQUIRE(::lstat(run.c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK(st.st_uid == 0);
  CHECK((st.st_mode & 07777) == 0700);
  CHECK(read_text(run + "/attempt_0/1/stdout.log") == "out-1\n");
  // The other user's folder as --log_dir: refused.
  const auto refused = run_launcher(args({"--master_port", "0", "--log_dir", shared + "/theirs"}, failing_worker("")),
                                    {}, 10s);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.err, Catch::Contains("belongs to user 65534"));
  victim.check_unchanged();
}

namespace {

// One row of /proc/net/tcp or tcp6: addresses as "HEXADDR:HEXPORT", the state ("0A": LISTEN,
// "01": ESTABLISHED), the socket's inode.
struct TcpSocket {
  std::string local, remote, state, inode;
};
std::vector<TcpSocket> tcp_sockets() {
  std::vector<TcpSocket> sockets;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(read_text(table));
    std::string line;
    std::getline(lines, line);  // header
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      TcpSocket socket;
      std::string slot, queues, timer, retransmits, uid, timeout;
      fields >> slot >> socket.local >> socket.remote >> socket.state >> queues >> timer >> retransmits >> uid >>
          timeout >> socket.inode;
      sockets.push_back(socket);
    }
  }
  return sockets;
}

// Whether a socket listens on 0.0.0.0/:: (every interface) or on 127.0.0.1 at `port`, from /proc/net.
struct Listening {
  bool any = false;
  bool loopback = false;
  bool other = false;
};
Listening listening_on(int port) {
  Listening found;
  char hex_port[8];
  std::snprintf(hex_port, sizeof hex_port, "%04X", port);
  for (const TcpSocket& socket : tcp_sockets()) {
    const std::string& local = socket.local;
    if (socket.state != "0A" || local.substr(local.find(':') + 1) != hex_port) continue;
    const std::string addr = local.substr(0, local.find(':'));
    if (addr.find_first_not_of('0') == std::string::npos) {
      found.any = true;
    } else if (addr == "0100007F" || addr == "00000000000000000000000001000000" ||
               addr == "0000000000000000FFFF00000100007F") {
      found.loopback = true;
    } else {
      found.other = true;
    }
  }
  return found;
}

std::vector<std::string> rdzv_node(const std::string& endpoint, const std::string& id, const std::string& out,
                                   const std::string& sleep) {
  return {launcher_path(), "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_endpoint", endpoint, "--rdzv_id", id,
          "--rdzv_timeout", "30", worker_path(), "--out", out, "--sleep", "*:" + sleep};
}

// Waits (bounded) until something listens on 127.0.0.1:port.
bool wait_listening(int port, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const Listening l = listening_on(port);
    if (l.loopback || l.any || l.other) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// Whether process `pid` holds an established TCP connection to 127.0.0.1:port (its sockets' inodes
// from /proc/PID/fd, the connections from /proc/net/tcp and tcp6).
bool connected_to(pid_t pid, int port) {
  std::set<std::string> inodes;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  for (const std::string& fd : list_dir(fds)) {
    char target[128];
    const ssize_t n = ::readlink((fds + "/" + fd).c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    const std::string link(target, static_cast<std::size_t>(n));
    if (link.rfind("socket:[", 0) == 0) inodes.insert(link.substr(8, link.size() - 9));
  }
  char remote_port[8];
  std::snprintf(remote_port, sizeof remote_port, ":%04X", port);
  // c10d's client socket is IPv6 with a v4-mapped address: both forms.
  const std::set<std::string> remotes = {"0100007F" + std::string(remote_port),
                                         "0000000000000000FFFF00000100007F" + std::string(remote_port)};
  for (const TcpSocket& socket : tcp_sockets()) {
    if (socket.state == "01" && remotes.count(socket.remote) != 0 && inodes.count(socket.inode) != 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("the rendezvous store listens on the endpoint's address only", "[process][rdzv]") {
  TempDir dir;
  const int port = pick_free_port("127.0.0.1");
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  Child first(rdzv_node(endpoint, "bind", dir.path(), "0"));
  REQUIRE(wait_listening(port, 20s));
  const Listening l = listening_on(port);
  CHECK(l.loopback);
  CHECK_FALSE(l.any);
  CHECK_FALSE(l.other);
  Child second(rdzv_node(endpoint, "bind", dir.path(), "0"));
  for (Child* node : {&first, &second}) {
    const auto outcome = node->wait(40s);
    REQUIRE(outcome);
    INFO(outcome->err);
    CHECK(outcome->exit_code == 0);
  }
  CHECK(read_record(dir.path() + "/rank1.attempt0").env.at("WORLD_SIZE") == "2");
}

TEST_CASE("a foreign c10d client that adds to counters and writes keys takes no node's slot", "[process][rdzv]") {
  const std::string python = DDP_TEST_PYTHON;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0) {
    SUCCEED("no python with torch (DDP_PYTHON) to play the foreign client; skipped");
    return;
  }
  TempDir dir;
  const int port = pick_free_port("127.0.0.1");
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  // The first node serves the store and claims a slot; then the stranger writes over everything it
  // can name (docs/launcher.md lists the keys), then the second node arrives.
  Child first(rdzv_node(endpoint, "job9", dir.path(), "0"), {{"DDP_RDZV_TOKEN", "job9-secret"}});
  REQUIRE(wait_listening(port, 20s));
  std::this_thread::sleep_for(300ms);
  const std::string foreign = ddp::str(
      "import datetime, torch.distributed as d\n"
      "s = d.TCPStore('127.0.0.1', ", port, ", is_master=False, timeout=datetime.timedelta(seconds=10))\n"
      "p = 'ddp_rdzv/job9/r0/'\n"
      "for k in ['joined', 'done', 'slot/0', 'slot/1']: s.add(p + 'x' + k, 5)\n"
      "s.add(p + 'joined', 5)\n"
      "for k in ['slot/0', 'slot/1', 'slot/2', 'master', 'closed', 'done/0', 'done/1']: s.set(p + k, 'abc')\n"
      "s.set(p + 'slot/1', 'claim 00ff 00ff')\n"
      "print('foreign client wrote', flush=True)\n");
  const auto stranger = run_launcher({python, "-c", foreign}, {}, 30s);
  INFO(stranger.out << stranger.err);
  REQUIRE(stranger.exit_code == 0);
  Child second(rdzv_node(endpoint, "job9", dir.path(), "0"), {{"DDP_RDZV_TOKEN", "job9-secret"}});
  for (Child* node : {&first, &second}) {
    const auto outcome = node->wait(40s);
    REQUIRE(outcome);
    INFO(outcome->err);
    CHECK(outcome->exit_code == 0);
  }
  std::set<std::string> ports;
  for (int rank = 0; rank < 2; ++rank) {
    const auto r = read_record(dir.path() + "/rank" + std::to_string(rank) + ".attempt0");
    CHECK(r.env.at("RANK") == std::to_string(rank));
    CHECK(r.env.at("GROUP_RANK") == std::to_string(rank));
    CHECK(r.env.at("WORLD_SIZE") == "2");
    CHECK(r.env.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(r.env.count("DDP_RDZV_TOKEN") == 0);  // the launchers' secret stays with them
    ports.insert(r.env.at("MASTER_PORT"));
  }
  CHECK(ports.size() == 1);
  CHECK(*ports.begin() != "abc");
}

TEST_CASE("a node that comes to a full fixed-size job is refused at once, the job unharmed", "[process][rdzv]") {
  // A fixed --nnodes 2 is rounds with MIN = MAX = 2 (Note [Dynamic rendezvous]): once round 0 is
  // full the third launcher is one too many; it must not wait in round 1 until --rdzv_timeout.
  TempDir dir;
  TempDir extra;
  const int port = pick_free_port("127.0.0.1");
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  // The workers sleep long enough that the store is still served when the third node comes.
  Child first(rdzv_node(endpoint, "full", dir.path(), "8"));
  REQUIRE(wait_listening(port, 20s));
  Child second(rdzv_node(endpoint, "full", dir.path(), "8"));
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (list_dir(dir.path()).size() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  REQUIRE(list_dir(dir.path()).size() >= 2);  // both workers started: the round is closed
  const auto third = run_launcher(rdzv_node(endpoint, "full", extra.path(), "0"), {}, 20s);
  INFO(third.err);
  CHECK(third.exit_code == 1);
  CHECK_THAT(third.err, Catch::Contains("rendezvous 'full' at " + endpoint + " already has all 2 nodes: this node is "
                                        "one too many"));
  CHECK(list_dir(extra.path()).empty());
  for (Child* node : {&first, &second}) {
    const auto outcome = node->wait(40s);
    REQUIRE(outcome);
    INFO(outcome->err);
    CHECK(outcome->exit_code == 0);
  }
}

TEST_CASE("a store that goes away mid-rendezvous: one line, no c10d backtrace", "[process][rdzv]") {
  TempDir dir;
  const int port = pick_free_port("127.0.0.1");
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  auto node = [&] {
    return std::vector<std::string>{launcher_path(), "--nnodes", "3", "--rdzv_endpoint", endpoint, "--rdzv_id", "gone",
                                    "--rdzv_timeout", "30", worker_path(), "--out", dir.path()};
  };
  Child server(node());
  REQUIRE(wait_listening(port, 20s));
  Child client(node());
  // The client has connected (under ASan its start alone can take longer than a fixed sleep; killed
  // before it connects, the server is a store that never came up: the next test), then has joined
  // and waits for the third node.
  const auto connect_deadline = std::chrono::steady_clock::now() + 20s;
  while (!connected_to(client.pid(), port) && std::chrono::steady_clock::now() < connect_deadline) {
    std::this_thread::sleep_for(20ms);
  }
  if (!connected_to(client.pid(), port)) {  // what the client did instead, for the failure's message
    const auto exited = client.wait(0ms);
    FAIL("the second launcher did not connect to the store at " << endpoint << " within 20 s; "
         << (exited ? "it exited " + std::to_string(exited->exit_code) + ", stderr: " + exited->err
                    : "it still runs, stderr so far: " + client.err_so_far()));
  }
  std::this_thread::sleep_for(300ms);
  server.signal(SIGKILL);
  REQUIRE(server.wait(5s));
  const auto outcome = client.wait(40s);
  REQUIRE(outcome);
  INFO(outcome->err);
  CHECK(outcome->exit_code == 1);
  CHECK(outcome->err.find("frame #") == std::string::npos);
  CHECK(outcome->err.find("Exception raised from") == std::string::npos);
  CHECK(std::count(outcome->err.begin(), outcome->err.end(), '\n') == 2);  // "waiting for 3 nodes", the error
  CHECK_THAT(outcome->err, Catch::Contains("ddp_launch: error: rendezvous 'gone' at " + endpoint));
  CHECK(list_dir(dir.path()).empty());
}

TEST_CASE("a store that never comes up: the client gives up at --rdzv_timeout", "[process][rdzv]") {
  // A socket bound to the endpoint without listening: the launcher cannot serve the store there
  // (EADDRINUSE), so it is a client, and every connect is refused. c10d's own connect retries gave
  // up after twice the timeout (10 s -> 22 s; a 30 s one outlasted the test above's 40 s wait);
  // the launcher waits for the store with its own deadline (Note [Bounded connect to the master]).
  TempDir dir;
  const int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(holder >= 0);
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(holder, reinterpret_cast<sockaddr*>(&where), sizeof where) == 0);
  socklen_t length = sizeof where;
  REQUIRE(::getsockname(holder, reinterpret_cast<sockaddr*>(&where), &length) == 0);
  const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(where.sin_port));
  Child client({launcher_path(), "--nnodes", "2", "--rdzv_endpoint", endpoint, "--rdzv_id", "never", "--rdzv_timeout",
                "10", worker_path(), "--out", dir.path()});
  const auto outcome = client.wait(18s);
  ::close(holder);
  REQUIRE(outcome);
  INFO(outcome->err);
  CHECK(outcome->exit_code == 1);
  CHECK(outcome->err.find("frame #") == std::string::npos);
  CHECK_THAT(outcome->err, Catch::Contains("ddp_launch: error: rendezvous 'never': could not reach the store at " +
                                           endpoint + " within 10 s (--rdzv_timeout)"));
  CHECK_THAT(outcome->err, Catch::Contains("nothing accepted a connection there"));
  CHECK(list_dir(dir.path()).empty());
}

TEST_CASE("launchers with different DDP_RDZV_TOKENs never form a job", "[process][rdzv]") {
  TempDir dir;
  TempDir logs;
  const std::string endpoint = "127.0.0.1:" + std::to_string(pick_free_port("127.0.0.1"));
  auto node = [&] {
    return std::vector<std::string>{launcher_path(), "--nnodes", "2", "--rdzv_endpoint", endpoint, "--rdzv_id", "mixed",
                                    "--rdzv_timeout", "3", "--log_dir", logs.path(), worker_path(), "--out", dir.path()};
  };
  Child first(node(), {{"DDP_RDZV_TOKEN", "one"}});
  Child second(node(), {{"DDP_RDZV_TOKEN", "two"}});
  std::string errors;
  for (Child* launcher : {&first, &second}) {
    const auto outcome = launcher->wait(40s);
    REQUIRE(outcome);
    CHECK(outcome->exit_code == 1);
    errors += outcome->err;
  }
  INFO(errors);
  CHECK_THAT(errors, Catch::Contains("does every launcher have the same DDP_RDZV_TOKEN?"));
  CHECK(list_dir(dir.path()).empty());   // no worker started
  CHECK(list_dir(logs.path()).empty());  // and no empty run folder is left behind
}
