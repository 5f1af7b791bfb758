#pragma once
// The liveness channel of a --recovery live job: every launcher keeps one torch-free TCP connection
// to the launcher that serves the rendezvous store, which marks a lost node's workers gone in the
// training's membership at once. See Note [Lost hosts in a live job] in launcher/channel/live_watch.cpp.
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ddp::launcher::channel {

// A launcher's name in the training's member ids ("<node key>/local<L>/attempt<K>"): "node<N>" for
// a node of the job's first rendezvous round, "node<N>.r<R>" for one that joined in round R > 0
// (node ranks repeat across rounds; the keys do not).
std::string live_node_key(int rendezvous_round, int node_rank);

// A node whose launcher the channel lost.
struct LostNode {
  std::string node_key;
  std::string host;             // what its launcher said in its hello, and the address it came from
  std::string host_name;        // what its launcher said alone
  int first_round_workers = 0;  // its workers in the training's first round (0: it joined later)
  std::string why;              // "its launcher's connection closed", or the silence
};

// --straggler_action: a node's ranks' step timings, relayed by the serving launcher to every other
// (See Note [Stragglers in a live job] in launcher/channel/live_watch.cpp).
struct NodeTimings {
  std::string node_key;
  std::string host_name;
  std::string items;  // observe::encode_timings's text
};

// What both ends keep for --straggler_action: the lines to send, the timings received. The launcher's
// supervision thread puts and takes; the channel's thread sends and receives.
class TimingsMailbox {
 public:
  void post(const std::string& line);
  std::vector<std::string> outgoing();
  void deliver(NodeTimings timings);
  std::vector<NodeTimings> take();

 private:
  std::mutex mutex_;
  std::vector<std::string> outgoing_;
  std::vector<NodeTimings> incoming_;  // bounded: dropped when nobody takes them
};

// The serving launcher's line for a node's timings, "timings <node key> <host> <items>", and its
// parse (the text after its first word; nothing when it is not that).
std::string relayed_timings_line(const NodeTimings& timings);
std::optional<NodeTimings> parse_relayed_timings(const std::string& text);

// The server's bookkeeping, pure (unit-tested): which connection is which node, and when a node
// is lost: its connection closed without a goodbye, or nothing heard from it for `silence_timeout_s`.
// Each connection's node is reported at most once.
class NodeLiveness {
 public:
  using Clock = std::chrono::steady_clock;
  explicit NodeLiveness(double silence_timeout_s) : silence_timeout_s_(silence_timeout_s) {}

  // "hello <node key> <first round workers> <host>" (the text after "hello"); false when malformed.
  bool hello(int connection, const std::string& text, const std::string& peer_address, Clock::time_point now);
  // Any line (a ping) from the connection.
  void heard(int connection, Clock::time_point now);
  // Its launcher ends normally (its workers succeeded): its connection's end is no loss.
  void goodbye(int connection);
  // The connection closed (end of stream, reset): its node, when that is a loss.
  std::optional<LostNode> closed(int connection);
  // The connections whose node has been silent past the timeout (each once; the caller closes them).
  std::vector<std::pair<int, LostNode>> silent(Clock::time_point now);
  // The node that said hello on `connection`, if any.
  const LostNode* node_of(int connection) const;

 private:
  struct Peer {
    LostNode node;
    Clock::time_point last_heard;
    bool said_goodbye = false;
  };
  double silence_timeout_s_;
  std::map<int, Peer> peers_;
};

// The store host's end: accepts the launchers, watches them on a thread of its own, and calls
// `on_lost` (on that thread) once per lost node, then tells every launcher still connected.
class LiveWatchServer {
 public:
  // `listen_fd`: bound and listening (taken over).
  LiveWatchServer(int listen_fd, double silence_timeout_s, std::function<void(const LostNode&)> on_lost);
  ~LiveWatchServer();
  LiveWatchServer(const LiveWatchServer&) = delete;
  LiveWatchServer& operator=(const LiveWatchServer&) = delete;
  // How many nodes were lost so far.
  int lost_nodes() const { return lost_.load(); }
  // --straggler_action: this node's timings to every other launcher; the others' (each once).
  void publish_timings(const std::string& node_key, const std::string& host_name, const std::string& items);
  std::vector<NodeTimings> take_timings() { return timings_.take(); }

 private:
  void run(int listen_fd, double silence_timeout_s);
  std::function<void(const LostNode&)> on_lost_;
  TimingsMailbox timings_;
  std::atomic<int> lost_{0};
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

// Every other launcher's end: connects (retrying), says which node it is, pings every
// `ping_interval_s`, hears the losses; says goodbye at the end only when told its workers succeeded
// (otherwise its end is a loss: its workers are gone from the training). The serving launcher is
// lost when its connection, once up, stays down for `lost_after_s` (See Note [The store's host lost]).
class LiveWatchClient {
 public:
  LiveWatchClient(std::string host, int port, std::string hello, double ping_interval_s, double lost_after_s);
  ~LiveWatchClient();
  LiveWatchClient(const LiveWatchClient&) = delete;
  LiveWatchClient& operator=(const LiveWatchClient&) = delete;
  int lost_nodes() const { return lost_.load(); }
  bool server_lost() const { return server_lost_.load(); }
  void set_succeeded(bool succeeded) { succeeded_ = succeeded; }
  // --straggler_action: this node's timings to the serving launcher (which relays them); the other
  // nodes' (each once).
  void publish_timings(const std::string& items) { timings_.post("timings " + items); }
  std::vector<NodeTimings> take_timings() { return timings_.take(); }

 private:
  void run(std::string host, int port, std::string hello, double ping_interval_s, double lost_after_s);
  TimingsMailbox timings_;
  std::atomic<int> lost_{0};
  std::atomic<bool> server_lost_{false};
  std::atomic<bool> succeeded_{false};
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace ddp::launcher::channel
