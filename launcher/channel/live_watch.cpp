#include "launcher/channel/live_watch.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>
#include <utility>

#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "launcher/channel/job_channel.h"
#include "launcher/process/net.h"

// Note [Lost hosts in a live job]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With --recovery live a whole host's loss kills its launcher too, so nobody on it can mark its
// workers gone in the training's membership (See Note [Live recovery with ddp_launch]); without a
// mark the survivors close their next round only after StoreMembershipOptions::settle_timeout.
// The launchers already know who is alive, as in restart mode (See Note [Coordinated restarts]),
// so they tell the training:
//   - The launcher that serves the rendezvous store (its host must stay anyway: the store's loss
//     ends the job) listens on a port the OS picked, published in the store before the first
//     round (See Note [One port per job] in launcher/rendezvous/rendezvous.h); every other launcher of the
//     job looks it up and connects to it once its
//     first round closed (retrying every 250 ms), says "hello <node key> <workers in the
//     training's first round> <host>", and pings every --rdzv_conf keep_alive_interval (default
//     1 s). Plain TCP lines over the job channel's pieces (LineConnection, start_connect), no
//     LibTorch in the launcher's common path; both ends run on a thread of their own, so a launcher
//     busy closing a rendezvous round still pings and still notices a loss.
//   - A connection closed without a goodbye (a killed host's kernel closes its sockets: end of
//     stream or reset; a launcher killed, or ended by a failure) is a lost node at once; silence
//     past keep_alive_interval x keep_alive_max_attempt (torchrun's keys, defaults 1 s x 5) is a
//     lost node after that timeout (a partition, a link down: nothing closes). A launcher whose
//     workers succeeded says goodbye: the job ends, nothing is lost.
//   - For a lost node the serving launcher marks its workers gone in the training's membership
//     (ddp_rdzv_mark_gone: See Note [Marking a lost node gone] in ddp/elastic/detail/membership_keys.h): exactly
//     once per worker and round, whoever else says it (the node's own launcher, restarting a dead
//     worker alone, says it of that worker), counting the node's members of the last closed round (none when the
//     settle timeout dropped them already), and again in the next round when one closes meanwhile
//     with them in it. Then it tells every launcher ("lost <node key>"), which count the job's
//     nodes without it (LiveAdmission: a replacement is admitted up to --nnodes MAX).
//   - Node keys (live_node_key) are the prefix of the workers' member ids, unique in the job.
// Limits: the serving host itself is not watched (its loss ends the job: Note [The store's host lost]); a partitioned node that
// comes back reconnects and is watched again, but stays counted as lost for admission (its workers
// rejoin the training as joiners only if its launcher restarts them).

// Note [Stragglers in a live job]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The straggler report compares every rank's step timings (See Note [Stragglers] in
// launcher/observe/straggler.h), so each launcher needs the others'. A live job has no job
// channel; its liveness channel connects every launcher to the serving one already, so the
// timings travel there: a launcher sends "timings <items>" (its ranks' new timings, at most every
// 100 ms), and the serving launcher, which knows each connection's node from its hello, relays
// "timings <node key> <host> <items>" to every other launcher and keeps a copy. Launch ranks are
// not unique in a live job (a node that joins later may get a node rank that a survivor still
// has), so a receiver keys another node's ranks by its node key (LiveStragglerPeers in
// launcher/agent/live_recovery.cpp). Timings lost with a connection are lost: the report waits for
// a complete window again.

namespace ddp::launcher::channel {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMaxHeldTimings = 1024;  // relayed lines nobody took (a launcher not watching)

void make_wake_pipe(int (&wake)[2]) {
  if (::pipe2(wake, O_CLOEXEC) != 0) throw ddp::Error(ddp::str("live watch: pipe2 failed: ", std::strerror(errno)));
}

}  // namespace

void TimingsMailbox::post(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (outgoing_.size() < kMaxHeldTimings) outgoing_.push_back(line);
}

std::vector<std::string> TimingsMailbox::outgoing() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(outgoing_, {});
}

void TimingsMailbox::deliver(NodeTimings timings) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (incoming_.size() < kMaxHeldTimings) incoming_.push_back(std::move(timings));
}

std::vector<NodeTimings> TimingsMailbox::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(incoming_, {});
}

std::string relayed_timings_line(const NodeTimings& timings) {
  return ddp::str("timings ", timings.node_key, " ", timings.host_name, " ", timings.items);
}

std::optional<NodeTimings> parse_relayed_timings(const std::string& text) {
  std::istringstream in(text);
  NodeTimings t;
  if (!(in >> t.node_key >> t.host_name >> t.items)) return std::nullopt;
  return t;
}

std::string live_node_key(int rendezvous_round, int node_rank) {
  return rendezvous_round == 0 ? ddp::str("node", node_rank) : ddp::str("node", node_rank, ".r", rendezvous_round);
}

bool NodeLiveness::hello(int connection, const std::string& text, const std::string& peer_address,
                         Clock::time_point now) {
  std::istringstream in(text);
  Peer peer;
  std::string workers;
  in >> peer.node.node_key >> workers;
  std::string host;
  std::getline(in >> std::ws, host);
  const auto count = parse_line_int(workers);
  if (peer.node.node_key.empty() || peer.node.node_key.find('/') != std::string::npos || !count || *count < 0) {
    return false;
  }
  peer.node.first_round_workers = *count;
  peer.node.host_name = host.empty() ? std::string("?") : host.substr(0, host.find(' '));
  peer.node.host = ddp::str(peer.node.host_name, " at ", peer_address);
  peer.last_heard = now;
  peers_[connection] = std::move(peer);
  return true;
}

void NodeLiveness::heard(int connection, Clock::time_point now) {
  const auto it = peers_.find(connection);
  if (it != peers_.end()) it->second.last_heard = now;
}

void NodeLiveness::goodbye(int connection) {
  const auto it = peers_.find(connection);
  if (it != peers_.end()) it->second.said_goodbye = true;
}

const LostNode* NodeLiveness::node_of(int connection) const {
  const auto it = peers_.find(connection);
  return it == peers_.end() ? nullptr : &it->second.node;
}

std::optional<LostNode> NodeLiveness::closed(int connection) {
  const auto it = peers_.find(connection);
  if (it == peers_.end()) return std::nullopt;  // never said hello, or already reported
  std::optional<LostNode> lost;
  if (!it->second.said_goodbye) {
    lost = it->second.node;
    lost->why = "its launcher's connection closed";
  }
  peers_.erase(it);
  return lost;
}

std::vector<std::pair<int, LostNode>> NodeLiveness::silent(Clock::time_point now) {
  std::vector<std::pair<int, LostNode>> lost;
  for (auto it = peers_.begin(); it != peers_.end();) {
    const double quiet_s = std::chrono::duration<double>(now - it->second.last_heard).count();
    if (quiet_s >= silence_timeout_s_ && !it->second.said_goodbye) {
      LostNode node = it->second.node;
      node.why = ddp::str("nothing heard from its launcher for ", silence_timeout_s_,
                          " s (--rdzv_conf keep_alive_interval x keep_alive_max_attempt)");
      lost.emplace_back(it->first, std::move(node));
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
  return lost;
}

LiveWatchServer::LiveWatchServer(int listen_fd, double silence_timeout_s, std::function<void(const LostNode&)> on_lost)
    : on_lost_(std::move(on_lost)) {
  try {
    make_wake_pipe(wake_);
  } catch (...) {
    ::close(listen_fd);
    throw;
  }
  thread_ = std::thread([this, listen_fd, silence_timeout_s] { run(listen_fd, silence_timeout_s); });
}

LiveWatchServer::~LiveWatchServer() { end_thread(wake_, thread_); }

void LiveWatchServer::publish_timings(const std::string& node_key, const std::string& host_name,
                                      const std::string& items) {
  timings_.post(relayed_timings_line({node_key, host_name, items}));
}

void LiveWatchServer::run(int listen_fd, double silence_timeout_s) {
  NodeLiveness table(silence_timeout_s);
  std::map<int, LineConnection> connections;
  int next_id = 0;
  const auto lose = [&](const LostNode& node) {
    ++lost_;
    on_lost_(node);
    for (auto& [id, c] : connections) c.send("lost " + node.node_key);
  };
  while (true) {
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd, POLLIN, 0}};
    std::vector<int> ids;
    for (auto& [id, c] : connections) {
      fds.push_back({c.fd(), static_cast<short>(POLLIN | (c.wants_write() ? POLLOUT : 0)), 0});
      ids.push_back(id);
    }
    ::poll(fds.data(), fds.size(), 100);
    if (fds[0].revents != 0) break;
    for (const std::string& line : timings_.outgoing()) {  // See Note [Stragglers in a live job]
      for (auto& [id, c] : connections) {
        if (table.node_of(id) != nullptr) c.send(line);
      }
    }
    if (fds[1].revents & POLLIN) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) connections.emplace(next_id++, LineConnection(fd));
    }
    const auto now = Clock::now();
    std::vector<LostNode> lost;
    for (std::size_t k = 0; k < ids.size(); ++k) {
      if (fds[k + 2].revents == 0) continue;
      const int id = ids[k];
      LineConnection& c = connections.at(id);
      bool alive = c.flush();
      if (alive) {
        alive = c.receive([&](const std::string& line) {
          const auto [word, rest] = split_word(line);
          if (word == "hello") {
            const std::string peer = process::socket_address(c.fd(), true);
            if (!table.hello(id, rest, peer.empty() ? "?" : peer, now)) c.close();  // not a launcher's line
          } else if (word == "ping") {
            table.heard(id, now);
          } else if (word == "bye") {
            table.goodbye(id);
          } else if (word == "timings") {  // See Note [Stragglers in a live job]
            const LostNode* node = table.node_of(id);
            if (node == nullptr || rest.empty() || rest.find(' ') != std::string::npos) return;
            table.heard(id, now);
            NodeTimings timings{node->node_key, node->host_name, rest};
            const std::string relayed = relayed_timings_line(timings);
            for (auto& [other, oc] : connections) {
              if (other != id && table.node_of(other) != nullptr) oc.send(relayed);
            }
            timings_.deliver(std::move(timings));
          } else {
            c.close();
          }
        });
      }
      if (!alive) {
        if (auto node = table.closed(id)) lost.push_back(std::move(*node));
        connections.erase(id);
      }
    }
    for (auto& [id, node] : table.silent(now)) {
      connections.erase(id);
      lost.push_back(std::move(node));
    }
    for (const LostNode& node : lost) lose(node);
  }
  connections.clear();
  ::close(listen_fd);
}

LiveWatchClient::LiveWatchClient(std::string host, int port, std::string hello, double ping_interval_s,
                                 double lost_after_s) {
  make_wake_pipe(wake_);
  thread_ = std::thread(
      [this, host = std::move(host), port, hello = std::move(hello), ping_interval_s, lost_after_s]() mutable {
        run(std::move(host), port, std::move(hello), ping_interval_s, lost_after_s);
      });
}

// Note [The store's host lost]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A --recovery live job cannot outlive the host that serves its store (the membership is there),
// and without a rule each survivor found out slowly: its workers' collectives failed, their
// regroup waited 60 s for the store, and the launcher restarted them --max_restarts times, each
// waiting again (4 minutes in the chaos trial that found it). The liveness client tells it
// within the silence timeout instead: the connection to the serving launcher, once up, closed
// (its host's kernel sends a reset or an end of stream) and no new one was established for
// keep_alive_interval x keep_alive_max_attempt (a killed launcher's port refuses; a dead host
// answers nothing, so each attempt gives up after a second). A partition does not trip it: the
// connection stays open while nothing crosses, and the serving launcher's close of a silent one
// reaches this end only once the link is back, when the next attempt succeeds at once. The
// launcher then stops its workers with one line naming the store's host (LiveRecovery) and
// restarts none.

LiveWatchClient::~LiveWatchClient() { end_thread(wake_, thread_); }

void LiveWatchClient::run(std::string host, int port, std::string hello, double ping_interval_s, double lost_after_s) {
  LineConnection link;
  bool connecting = false;
  bool ever_connected = false;
  bool warned = false;
  const auto started = Clock::now();
  auto next_try = started;
  auto last_ping = started;
  auto last_up = started;  // when the connection was last seen established
  auto connect_began = started;
  const auto seconds = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  const auto ping_every = seconds(ping_interval_s);
  std::set<std::string> lost;
  while (true) {
    const auto now = Clock::now();
    if (!link.is_open() && now >= next_try) {
      next_try = now + std::chrono::milliseconds(250);
      const int fd = start_connect(host, port);
      if (fd >= 0) {
        link = LineConnection(fd);
        connecting = true;
        connect_began = now;
      }
    }
    if (link.is_open() && !connecting) {
      last_up = now;
    } else if (ever_connected && now - last_up > seconds(lost_after_s)) {
      server_lost_ = true;  // See Note [The store's host lost]
    }
    if (!ever_connected && !warned && now - started > std::chrono::seconds(10)) {
      warned = true;
      spdlog::warn("the live job's liveness channel at {}:{} is not reachable yet: if this host is lost, the "
                   "survivors notice it only by their settle timeout",
                   host, port);
    }
    pollfd fds[2] = {{wake_[0], POLLIN, 0}, {link.fd(), 0, 0}};
    if (link.is_open()) fds[1].events = static_cast<short>(POLLIN | (connecting || link.wants_write() ? POLLOUT : 0));
    ::poll(fds, link.is_open() ? 2 : 1, 100);
    if (fds[0].revents != 0) break;
    if (!link.is_open()) continue;
    if (connecting) {
      if (fds[1].revents == 0) {
        if (Clock::now() - connect_began > std::chrono::seconds(1)) {  // no answer: try again
          link.close();
          connecting = false;
        }
        continue;
      }
      int error = 0;
      socklen_t len = sizeof error;
      ::getsockopt(link.fd(), SOL_SOCKET, SO_ERROR, &error, &len);
      if (error != 0) {  // not listening (yet): try again
        link.close();
        connecting = false;
        continue;
      }
      connecting = false;
      ever_connected = true;
      link.send("hello " + hello);
      last_ping = Clock::now();
    }
    if (Clock::now() - last_ping >= ping_every) {
      link.send("ping");
      last_ping = Clock::now();
    }
    for (const std::string& line : timings_.outgoing()) link.send(line);  // See Note [Stragglers in a live job]
    const bool alive = link.flush() && link.receive([&](const std::string& line) {
      const auto [word, rest] = split_word(line);
      if (word == "lost" && lost.insert(rest).second) ++lost_;
      if (word == "timings") {
        if (auto t = parse_relayed_timings(rest)) timings_.deliver(std::move(*t));
      }
    });
    if (!alive) link.close();  // reconnects; still down after lost_after_s: See Note [The store's host lost]
  }
  if (link.is_open() && !connecting) {
    // The last timings too: a launcher that leaves (--straggler_action replace) decided on them,
    // and the others' verdict needs them (See Note [Stragglers in a live job]).
    for (const std::string& line : timings_.outgoing()) link.send(line);
    if (succeeded_) link.say_goodbye();
    else link.flush();
  }
}

}  // namespace ddp::launcher::channel
