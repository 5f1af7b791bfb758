#pragma once
// A launcher's end of the job channel: it tells the coordinator (node 0's launcher) when its group
// failed or ended and how far its ranks are, and hears the same of every other node. The attempt's
// poll loop pumps it; between rounds the supervisor waits on it for the verdict. Single-threaded.
// See Note [Coordinated restarts] in launcher/channel/job_channel.cpp.
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/channel/job_channel.h"

namespace ddp::launcher::process {
class SignalPipe;
}  // namespace ddp::launcher::process

namespace ddp::launcher::channel {

struct JobLinkOptions {
  std::string coordinator_host;  // the job's master address
  int coordinator_port = 0;
  int nnodes = 1;
  int node_rank = 0;
  int first_rank = 0;
  int nproc = 1;
  std::string host_name;
  double connect_timeout_s = 600;  // --rdzv_timeout
};

// What the round's end led to.
enum class RoundVerdict {
  kRestart,     // every node restarts its group (the next round)
  kDone,        // the job ends
  kNoAnswer,    // the coordinator was not reached, or did not answer in time (the message says why)
  kSignalled,   // the launcher received a forwarded signal while it waited
};

class JobLink {
 public:
  explicit JobLink(JobLinkOptions options);
  JobLink(const JobLink&) = delete;
  JobLink& operator=(const JobLink&) = delete;

  // For the attempt's poll(): the descriptor (-1 between connection tries) and the events it waits for.
  int poll_fd() const;
  short poll_events() const;
  // Connects (retrying every 100 ms), reads and writes what is ready; never blocks.
  void pump();

  // The first stop of `round` not yet taken: "host2 (node 2, rank 2): rank 2 exited with 1", or a
  // lost node, or the coordinator itself gone. Each is returned once.
  std::optional<std::string> take_stop(int round);
  // This node's group failed in `round` (said once per round).
  void report_failure(int round, const std::string& what);
  // This node's ranks' last steps (sent when they changed, at most every 200 ms).
  void publish_progress(int round, const std::vector<std::pair<int, std::int64_t>>& steps);
  // " (across the job, rank(s) 2 on host2 did not arrive: at step 14, the others at 15)", or "" when
  // the other nodes' ranks are not behind this node's `local` ones or nothing is known of them.
  std::string describe_behind(int round, const std::vector<std::pair<int, std::int64_t>>& local) const;
  // --straggler_action: this node's ranks' step timings (text the observe layer encodes, See Note
  // [Stragglers] in launcher/observe/straggler.h), gathered and sent at most every 200 ms; and the
  // other nodes' of `round`, each text once.
  void publish_timings(int round, const std::string& items);
  std::vector<std::string> take_timings(int round);

  // Reports the end of this node's group in `round` ("ok", "failed" or "final": cannot restart)
  // and waits, at most `timeout_s` and never past a forwarded signal, for the coordinator's
  // verdict. A kNoAnswer's reason is in `why`.
  RoundVerdict finish_round(int round, const std::string& kind, double timeout_s, process::SignalPipe& signals,
                            std::string& why);
  // How many nodes the coordinator reported lost (node 0 included when the coordinator is gone).
  int lost_nodes() const { return static_cast<int>(lost_.size()); }
  // Whether the link has ever reached the coordinator.
  bool connected_once() const { return hello_sent_; }
  // A static job: waits, at most timeout_s, for the coordinator's welcome and returns the port of
  // node 0's workers' store that it names (See Note [One port per job] in launcher/rendezvous/rendezvous.h).
  // Throws ddp::TimeoutError with one line when node 0's launcher did not answer in time.
  int wait_for_store_port(double timeout_s);

  // What the summary says about the rest of the job: the lost nodes, the stop that came from
  // elsewhere, the coordinator's notes.
  const std::vector<std::string>& news() const { return news_; }
  // "host1 (node 1, ranks 2-3)", from the table the coordinator sent; "node K" before it came.
  std::string name_of_node(int node) const;
  std::string name_of_rank(int rank) const;

  // Says goodbye (the coordinator does not count this node as lost) and closes.
  ~JobLink();

 private:
  struct NodeInfo {
    int first_rank = 0;
    int nproc = 0;
    std::string host;
  };
  using Clock = std::chrono::steady_clock;

  void try_connect();
  void on_line(const std::string& line);
  void connection_lost();
  void add_news(const std::string& line);

  JobLinkOptions options_;
  LineConnection link_;
  bool connecting_ = false;
  bool hello_sent_ = false;
  bool coordinator_gone_ = false;
  Clock::time_point started_;
  Clock::time_point next_try_;
  std::map<int, NodeInfo> nodes_;
  std::map<int, std::string> stops_;  // round -> what stopped it
  std::map<int, bool> stop_taken_;
  std::optional<std::string> job_stop_;  // a lost node or the coordinator gone: every round stops
  std::map<int, std::string> verdicts_;
  std::map<int, bool> failure_reported_;
  std::map<int, std::int64_t> remote_steps_;  // rank -> last step, this round
  int remote_steps_round_ = -1;
  std::vector<std::pair<int, std::int64_t>> sent_steps_;
  Clock::time_point last_progress_sent_;
  std::string unsent_timings_;
  int unsent_timings_round_ = -1;
  Clock::time_point last_timings_sent_;
  std::vector<std::pair<int, std::string>> remote_timings_;  // (round, items), not yet taken
  Clock::time_point last_ping_;
  std::vector<std::string> news_;
  std::map<int, bool> lost_;  // node -> lost
  int store_port_ = 0;
};

}  // namespace ddp::launcher::channel
