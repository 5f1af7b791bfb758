#pragma once
// Stragglers named (ddp_launch --straggler_action warn): which rank holds the job up while it still
// steps, from every rank's heartbeat timings. Pure logic: the board feeds it (local ranks from their
// heartbeats, the other nodes' from the job channel), the agent logs what it says. Torch-free.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher::observe {

// Note [Stragglers]
// ~~~~~~~~~~~~~~~~~
// In synchronous data parallelism every rank's iteration takes the slowest rank's time, so step
// times alone name nobody. What differs is where the time goes: each iteration's backward waits,
// after its own compute, for the gradient all-reduce to complete (the exposed wait, DDP's heartbeat
// carries it: AgentMessage::wait_time_s, with the waits of the loop's own collectives that it is
// told of, as ddp::FaultTolerant's step agreement: DistributedDataParallel::count_wait). The rank that arrives last at the all-reduce waits only
// for the transfer; the others wait for it as well. So a rank's busy time (its iteration less that
// wait: forward, backward, optimizer, data loading, its own code) is what it costs the job, and the
// rank with the least wait in an iteration is the one the others waited for (no clocks compared:
// hosts' clocks disagree by more than a fast step).
// Over the last `window` iterations that every current rank reported (aligned by DDP's step count),
// a rank's ratio is its median busy time over the median of the other ranks' medians (the others',
// so that with 2 ranks a rank twice as slow reads 2.0x, not the 1.33x of the median of both), and
// its last-arrival share is the fraction of those iterations in which it waited least. It is named
// when its ratio reaches `factor`. Medians, not means: one stall (a page-in, a burst of a neighbour's
// load) of 0.5 s in 50 steps of 4 ms made a mean read 1.6x for the window on a loaded machine
// (hosts.straggler's even job beside a benchmark); a rank is named only when it is slow in most of
// the window's steps, so a persistent straggler is named after about half a window. Current ranks are those whose last step is within one window of the
// newest and whose first is at least a window old: a rank that ended or was restarted drops out
// instead of leaving every step incomplete, and one that joined a live job (a hot spare, a
// respawned worker, a new node: its steps start at the job's) counts once it has a window of its
// own, so the others' standings go on meanwhile (a straggler replaced by a spare stays named until
// its steps age out). Fewer than `window` complete steps, or fewer than 2 current ranks: no verdict.
struct StragglerOptions {
  double factor = 1.5;  // --straggler_factor
  int window = 50;      // --straggler_window (steps)
};

// One rank's one synchronized iteration, from its next heartbeat.
struct StepTiming {
  std::int64_t step = 0;
  double busy_s = 0;  // the iteration's wall time less its exposed wait
  double wait_s = 0;  // what its backward waited for after its own compute
};

struct RankStanding {
  int rank = 0;
  double ratio = 1;         // its median busy time over the median of the other ranks' medians
  double last_share = 0;    // share of the window's iterations in which it waited least
  bool straggler = false;   // ratio >= factor
  std::int64_t first_step = 0;  // the window's oldest and newest complete steps
  std::int64_t last_step = 0;
  // Set for another node's rank in a live job, keyed apart from its rank (which may repeat across
  // nodes there: See Note [Stragglers in a live job] in launcher/channel/live_watch.cpp).
  std::string host;
};

class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerOptions options) : options_(options) {}
  const StragglerOptions& options() const { return options_; }
  // A rank's timing; an older step than one already held for that rank replaces nothing.
  void add(int rank, const StepTiming& timing);
  // A rank that starts over (its worker restarted) or left: its timings go.
  void forget(int rank);
  void clear() { timings_.clear(); }
  // Every current rank's standing over the last window (See Note [Stragglers]), by rank; empty
  // without a verdict.
  std::vector<RankStanding> standings() const;

 private:
  StragglerOptions options_;
  std::map<int, std::map<std::int64_t, StepTiming>> timings_;  // rank -> step -> timing (the last 4 windows)
};

// "rank 3 on host2: steps 1.9x the median for the last 50 (steps 74-123); last to arrive in 96% of
// all-reduces" (the window's steps may skip some that a rank did not report)
std::string describe_straggler(const RankStanding& standing, int window, const std::string& rank_name);

// The other launchers of a job of several nodes, as the straggler report sees them: the job channel
// in restart-based rounds, the liveness channel in a live job (See Note [Stragglers in a live job]
// in launcher/channel/live_watch.cpp). The attempt's loop calls it; the agent's policy makes it.
class StragglerPeers {
 public:
  virtual ~StragglerPeers() = default;
  // Sends this node's ranks' new timings (keyed by launch rank) in `round`, and returns the other
  // nodes' that came since the last call, keyed so that no key is another's or a local rank's.
  virtual std::vector<std::pair<int, StepTiming>> exchange(int round, const std::vector<std::pair<int, StepTiming>>& local) = 0;
  // "rank 3 on host2" for a key of exchange()'s, or of this node's ranks.
  virtual std::string name_of(int key) const = 0;
  // A key of exchange()'s that is not the rank itself: the rank and its host (for /metrics).
  virtual std::optional<std::pair<int, std::string>> rank_and_host(int key) const {
    (void)key;
    return std::nullopt;
  }
  // Whether this launcher names every node's stragglers (one per job does) or only its own ranks.
  virtual bool names_every_rank() const = 0;
  // --straggler_action replace, one of this node's ranks named: tells the job this node leaves, and
  // returns nothing; or returns why it cannot leave (it is only named then).
  virtual std::optional<std::string> leave(int round, const std::string& why) = 0;
};

// The job channel's text for timings: "RANK:STEP:BUSY_US:WAIT_US" items joined by ','; parsing
// skips items that are not four numbers (a launcher of another version), and values that cannot be.
std::string encode_timings(const std::vector<std::pair<int, StepTiming>>& timings);
std::vector<std::pair<int, StepTiming>> decode_timings(const std::string& text);

}  // namespace ddp::launcher::observe
