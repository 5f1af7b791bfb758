#include "launcher/channel/job_coordinator.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "launcher/channel/job_channel.h"
#include "launcher/process/spawn.h"

namespace ddp::launcher::channel {
namespace {

using Clock = std::chrono::steady_clock;

// What the coordinator knows of one node (kept after its launcher left, to name it).
struct NodeRecord {
  bool known = false;
  int first_rank = 0;
  int nproc = 0;
  std::string host;
  std::string line;               // "node K FIRST NPROC HOST", as sent to every launcher
  std::optional<int> connection;  // index into connections
  bool lost = false;
  std::optional<int> ended_round;
  std::string ended_kind;         // ok, failed or final
  Clock::time_point last_heard;   // its launcher's last line (a ping at least every 250 ms)
};

struct Connection {
  LineConnection link;
  int node = -1;  // -1 until its hello
  bool said_bye = false;
};

class CoordinatorLoop {
 public:
  CoordinatorLoop(int listen_fd, JobCoordinatorOptions options, int wake_fd)
      : listen_fd_(listen_fd), options_(options), wake_fd_(wake_fd), nodes_(options.nnodes) {}

  void run(const std::atomic<double>& linger_s) {
    while (!ending_) step(100);
    // The job ended on this node: tell everyone still here, then wait (bounded) until they leave.
    if (!over_) {
      note_silent_nodes(-1);
      broadcast(ddp::str("verdict ", round_, " done"));
    }
    const auto until = process::after_seconds(linger_s.load());
    while (Clock::now() < until && any_member_pending()) step(50);
    for (auto& c : connections_) c.link.close();
    ::close(listen_fd_);
  }

 private:
  // Whether another launcher is still connected or has not connected yet: a launcher slower to start
  // than node 0's whole job (See Note [Coordinated restarts]; with a rendezvous store it first looks
  // the channel up there, which lives until this linger ends) is waited for too.
  bool any_member_pending() const {
    for (size_t node = 1; node < nodes_.size(); ++node) {
      if (!nodes_[node].known) return true;
    }
    for (const auto& c : connections_) {
      // Node 0's own link closed before this.
      if (c.link.is_open() && c.node != 0) return true;
    }
    return false;
  }

  void step(int max_wait_ms) {
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    std::vector<size_t> which;
    for (size_t i = 0; i < connections_.size(); ++i) {
      if (!connections_[i].link.is_open()) continue;
      const short events = POLLIN | (connections_[i].link.wants_write() ? POLLOUT : 0);
      fds.push_back({connections_[i].link.fd(), events, 0});
      which.push_back(i);
    }
    int wait_ms = max_wait_ms;
    if (deadline_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline_ - Clock::now()).count();
      wait_ms = static_cast<int>(std::max<long long>(0, std::min<long long>(wait_ms, left + 1)));
    }
    ::poll(fds.data(), fds.size(), wait_ms);
    if (fds[0].revents != 0) {
      char byte = 0;
      if (::read(wake_fd_, &byte, 1) <= 0 || byte == 'e') ending_ = true;
    }
    if (fds[1].revents & POLLIN) accept_one();
    for (size_t k = 0; k < which.size(); ++k) {
      const short revents = fds[k + 2].revents;
      if (revents == 0) continue;
      const size_t i = which[k];
      bool alive = true;
      if (revents & POLLOUT) alive = connections_[i].link.flush();
      if (alive && (revents & (POLLIN | POLLHUP | POLLERR))) {
        alive = connections_[i].link.receive([&](const std::string& line) { handle(i, line); });
      }
      if (!alive) disconnected(i);
    }
    if (deadline_ && !over_ && Clock::now() >= *deadline_) round_timed_out();
  }

  void accept_one() {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    connections_.push_back({LineConnection(fd), -1, false});
  }

  void send_to(int node, const std::string& line) {
    if (node < 0 || !nodes_[node].connection) return;
    connections_[*nodes_[node].connection].link.send(line);
  }

  void broadcast(const std::string& line, int except_node = -1) {
    for (auto& c : connections_) {
      if (c.node >= 0 && c.node != except_node && c.link.is_open()) c.link.send(line);
    }
  }

  std::string name_of(int node) const {
    const NodeRecord& n = nodes_[node];
    if (!n.known) return ddp::str("node ", node, " (never connected)");
    return node_name(n.host, node, n.first_rank, n.nproc);
  }

  void handle(size_t i, const std::string& line) {
    Connection& c = connections_[i];
    const auto [word, rest] = split_word(line);
    if (c.node < 0) {
      if (word == "hello") hello(i, rest);
      else c.link.close();  // not a launcher of this job
      return;
    }
    nodes_[c.node].last_heard = Clock::now();
    if (word == "ping") return;
    if (word == "failed") {
      const auto [round, what] = split_word(rest);
      if (!over_ && parse_line_int(round) == round_) stop_round(c.node, ddp::str(name_of(c.node), ": ", what));
    } else if (word == "ended") {
      const auto [round, kind] = split_word(rest);
      const bool known_kind = kind == "ok" || kind == "failed" || kind == "final";
      if (!over_ && parse_line_int(round) == round_ && known_kind) ended(c.node, kind);
    } else if (word == "progress" || word == "timings") {
      broadcast(ddp::str(word, " ", c.node, " ", rest), c.node);
    } else if (word == "bye") {
      c.said_bye = true;
    } else {
      c.link.close();
      disconnected(i);
    }
  }

  // "hello NODE FIRST_RANK NPROC HOST"
  void hello(size_t i, const std::string& rest) {
    Connection& c = connections_[i];
    const auto [node_text, r1] = split_word(rest);
    const auto [first_text, r2] = split_word(r1);
    const auto [nproc_text, host] = split_word(r2);
    const auto node = parse_line_int(node_text);
    const auto first = parse_line_int(first_text);
    const auto nproc = parse_line_int(nproc_text);
    const bool valid = node && first && nproc && *node >= 0 && *node < options_.nnodes && *first >= 0 && *nproc >= 1 &&
                       !host.empty() && host.find(' ') == std::string::npos;
    if (!valid || (nodes_[*node].connection && connections_[*nodes_[*node].connection].link.is_open())) {
      c.link.close();
      return;
    }
    c.node = *node;
    NodeRecord& n = nodes_[*node];
    n.known = true;
    n.first_rank = *first;
    n.nproc = *nproc;
    n.host = host;
    n.lost = false;
    n.last_heard = Clock::now();
    n.connection = static_cast<int>(i);
    n.line = ddp::str("node ", *node, " ", *first, " ", *nproc, " ", host);
    for (const auto& other : nodes_) {
      if (other.known) c.link.send(other.line);
    }
    broadcast(n.line, *node);
    if (options_.store_port > 0) c.link.send(ddp::str("store ", options_.store_port));
    c.link.send(ddp::str("round ", round_));
    // A launcher slower to start than node 0's whole job: the job's end, so that this coordinator
    // going away with node 0's launcher is not taken for node 0's loss.
    if (ending_ || over_) c.link.send(ddp::str("verdict ", round_, " done"));
  }

  // Someone's group failed (or a node was lost): every node stops its group, once per round.
  // `what` names the node ("host2 (node 2, rank 2): rank 2 exited with 3").
  void stop_round(int node, const std::string& what) {
    if (!deadline_) deadline_ = process::after_seconds(options_.join_timeout_s);
    if (stopped_round_ == round_) return;
    stopped_round_ = round_;
    broadcast(ddp::str("stop ", round_, " ", node, " ", what));
  }

  void ended(int node, const std::string& kind) {
    nodes_[node].ended_round = round_;
    nodes_[node].ended_kind = kind;
    if (kind != "ok") stop_round(node, ddp::str(name_of(node), ": its worker group failed"));
    // No next round can include this node: it ends now, and needs nobody else to.
    if (kind == "final" || (kind == "failed" && round_ >= options_.max_restarts)) {
      note_silent_nodes(node);
      send_to(node, ddp::str("verdict ", round_, " done"));
    }
    settle_round();
  }

  // Tells `to` (every launcher when -1) which nodes that have not ended the round have been silent
  // for over 1 s (their launchers ping every 250 ms): a partition closes nothing, so this is how the
  // others learn of it before their verdict.
  void note_silent_nodes(int to) {
    for (int k = 0; k < options_.nnodes; ++k) {
      const double silent_s = std::chrono::duration<double>(Clock::now() - nodes_[k].last_heard).count();
      if (!nodes_[k].known || nodes_[k].lost || nodes_[k].ended_round == round_ || silent_s <= 1) continue;
      const std::string note = ddp::str("note ", name_of(k), ": nothing heard from its launcher for ",
                                        static_cast<int>(silent_s * 10) / 10.0,
                                        " s (cut off from the network, or stopped?)");
      if (to < 0) broadcast(note);
      else send_to(to, note);
    }
  }

  void disconnected(size_t i) {
    Connection& c = connections_[i];
    c.link.close();
    if (c.node < 0) return;
    NodeRecord& n = nodes_[c.node];
    n.connection.reset();
    const bool finished = c.said_bye || (n.ended_round == round_ && n.ended_kind == "ok");
    if (finished || over_) return;
    n.lost = true;
    const std::string what = ddp::str(name_of(c.node), " was lost: its launcher's connection to the job's coordinator ",
                                      "closed (the launcher or its host is gone)");
    broadcast(ddp::str("lost ", c.node, " ", what));
    stop_round(c.node, what);
    settle_round();
  }

  // Every node has reported the round's end (or is gone): the verdict.
  void settle_round() {
    bool all_ok = true, restartable = round_ < options_.max_restarts;
    for (int k = 0; k < options_.nnodes; ++k) {
      const NodeRecord& n = nodes_[k];
      if (n.lost) {
        restartable = false;
        all_ok = false;
        continue;
      }
      if (n.ended_round != round_) return;
      all_ok = all_ok && n.ended_kind == "ok";
      restartable = restartable && n.ended_kind != "final";
    }
    if (all_ok || !restartable) {
      broadcast(ddp::str("verdict ", round_, " done"));
      deadline_.reset();
      over_ = true;  // no more rounds: later reports are not counted
      return;
    }
    broadcast(ddp::str("verdict ", round_, " restart"));
    ++round_;
    deadline_.reset();
  }

  void round_timed_out() {
    std::vector<std::string> missing;
    for (int k = 0; k < options_.nnodes; ++k) {
      if (!nodes_[k].lost && nodes_[k].ended_round != round_) missing.push_back(name_of(k));
    }
    broadcast(ddp::str("note ", ddp::join(missing, ", "), " did not report the end of round ", round_, " within ",
                       options_.join_timeout_s, " s (--rdzv_timeout): ending the job"));
    broadcast(ddp::str("verdict ", round_, " done"));
    deadline_.reset();
    over_ = true;
  }

  int listen_fd_;
  JobCoordinatorOptions options_;
  int wake_fd_;
  std::vector<NodeRecord> nodes_;
  std::vector<Connection> connections_;
  int round_ = 0;
  int stopped_round_ = -1;
  bool over_ = false;  // the verdict "done" went out
  std::optional<Clock::time_point> deadline_;
  bool ending_ = false;
};

}  // namespace

JobCoordinator::JobCoordinator(int listen_fd, JobCoordinatorOptions options) {
  if (::pipe2(wake_, O_CLOEXEC) != 0) {
    ::close(listen_fd);
    throw ddp::Error(ddp::str("job channel: pipe2 failed: ", std::strerror(errno)));
  }
  thread_ = std::thread([this, listen_fd, options] {
    CoordinatorLoop loop(listen_fd, options, wake_[0]);
    loop.run(linger_s_);
  });
}

JobCoordinator::~JobCoordinator() { end_thread(wake_, thread_); }

}  // namespace ddp::launcher::channel
