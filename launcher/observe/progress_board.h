#pragma once
// What the launcher knows about its local workers' progress (from their heartbeats, see
// Note [Agent channel] in ddp/base/agent_message.h): the hang watchdog's facts and the Prometheus
// series. Thread-safe: the supervisor writes, the metrics server's thread reads snapshots.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/base/agent_message.h"
#include "launcher/observe/agent_socket.h"
#include "launcher/observe/straggler.h"
#include "launcher/resources/gpu_select.h"

namespace ddp::launcher::observe {

using SteadyClock = std::chrono::steady_clock;

struct WorkerIdentity {
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
};

struct RankProgress {
  WorkerIdentity worker;
  bool heard = false;     // a message of this attempt arrived
  bool exited = false;    // the worker has ended: the watchdog no longer watches it
  std::optional<std::int64_t> step;
  std::optional<std::int64_t> samples;
  std::optional<double> samples_per_second;
  double step_time_s = 0;
  double comm_time_s = 0;
  std::optional<double> loss;
  double timestamp_s = 0;  // worker's wall clock at its last message
  SteadyClock::time_point last_heard;
  // Where the samples/s window started (see ProgressBoard::record).
  std::int64_t rate_samples = 0;
  SteadyClock::time_point rate_since;
};

// Datagrams ProgressBoard::record dropped, by reason (never reset: they count over all attempts).
struct DroppedAgentMessages {
  std::int64_t malformed = 0;  // not a message of this version
  std::int64_t sender = 0;     // not from a worker of this attempt (see Note [Agent sender credentials])
  std::int64_t values = 0;     // from a worker, with values that cannot be (see Note [Validated progress])
};

// What ProgressBoard::record made of a datagram.
enum class AgentVerdict {
  kRecorded,        // a heartbeat, its values taken
  kMalformed,       // dropped: not a message of this version
  kForeignSender,   // dropped: the kernel's credentials do not name this rank's worker
  kInvalidValues,   // a heartbeat (the worker is alive), its values dropped
};

struct JobProgress {
  int node_rank = 0;
  int world_size = 1;
  int restarts = 0;
  int worker_failures = 0;
  DroppedAgentMessages dropped;
  std::vector<RankProgress> ranks;  // this node's workers, by local rank
  bool supervising = false;         // a worker group runs (See Note [Health endpoints])
  SteadyClock::time_point last_turn;  // the supervision loop's last pass
  std::vector<RankStanding> stragglers;  // --straggler_action: every current rank's standing (all nodes)
};

// What a health endpoint answers: ok (HTTP 200) or not (503), and one line saying why.
struct ProbeAnswer {
  bool ok = false;
  std::string text;
};

struct StuckRank {
  WorkerIdentity worker;
  double silent_s = 0;
  std::optional<std::int64_t> step;           // its last reported step
  std::optional<std::int64_t> others_min_step;  // the other local ranks' steps, when they report any
  std::optional<std::int64_t> others_max_step;
  bool whole_world_local = true;              // every rank of the job runs on this node
};

class ProgressBoard {
 public:
  // With `stragglers`, heartbeats' timings feed a StragglerDetector (See Note [Stragglers]).
  ProgressBoard(int node_rank, int world_size, std::optional<StragglerOptions> stragglers = std::nullopt);

  // A new rendezvous round's place of this node (an elastic job's rounds change both).
  void set_membership(int node_rank, int world_size);
  // A new attempt's workers (restart count `attempt`): forgets the previous attempt's progress.
  void begin_attempt(int attempt, const std::vector<WorkerIdentity>& workers);
  // Takes a datagram received at `now`. Only a message whose sender credentials name the worker of
  // this attempt with the message's rank and pid counts (see Note [Agent sender credentials] in
  // launcher/observe/agent_socket.h), and only plausible values reach the series (see Note [Validated
  // progress]); everything else is dropped and counted in JobProgress::dropped.
  //
  // Note [Validated progress]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~
  // What a worker reports goes to /metrics as it is, so a bug in a training loop (a NaN loss, a
  // negative or restarted sample count) would show as NaN, negative or decreasing counters, which
  // break Prometheus' rate() and alerts. A report is taken whole or not at all: every value must be
  // finite, step >= 1, samples and times >= 0, and step and samples must not go below what this
  // rank reported before in this attempt. A report that fails is dropped and counted, but it still
  // counts as a heartbeat: its sender is the worker (the kernel says so), which is alive, and the
  // watchdog must not stop a job because its loss became NaN. Counters restart with each attempt,
  // as they do when any exporter restarts.
  AgentVerdict record(const AgentDatagram& datagram, SteadyClock::time_point now);
  void mark_exited(int rank);
  // --recovery live: `worker`'s rank runs in a new process (See Note [Restarting one live worker]
  // in launcher/agent/live_respawn.h): its entry starts over with the new pid, the others keep theirs.
  void restart_rank(const WorkerIdentity& worker);
  void count_failure();

  // --straggler_action (See Note [Stragglers]): the local ranks' timings recorded since the last call
  // (for the job channel), the other nodes' timings, and every current rank's standing.
  bool watches_stragglers() const { return stragglers_.has_value(); }
  const StragglerOptions& straggler_options() const { return stragglers_->options(); }
  std::vector<std::pair<int, StepTiming>> take_local_timings();
  void add_remote_timings(const std::vector<std::pair<int, StepTiming>>& timings);
  // Another node's rank keyed apart from its rank (StragglerPeers::rank_and_host): its standings and
  // /metrics say that rank and host.
  void label_remote_rank(int key, int rank, const std::string& host);
  std::vector<RankStanding> straggler_standings() const;
  int node_rank() const;

  // Note [Hang watchdog]
  // ~~~~~~~~~~~~~~~~~~~~
  // A rank is silent when it has sent at least one heartbeat in this attempt, is still running, and
  // has sent nothing for more than timeout_s. The clock starts at the first heartbeat: start-up
  // (loading LibTorch, data, rendezvous) has no step rate to compare with and is bounded by the
  // rendezvous and collective timeouts instead. Of the silent ranks, those at the lowest step of all
  // running ranks are stuck: a silent rank at a higher step waits in a collective for them (see
  // Note [Heartbeat at forward]). When every silent rank is at the same step, all are reported.
  std::vector<StuckRank> stuck(SteadyClock::time_point now, double timeout_s) const;

  JobProgress snapshot() const;

  // Note [Health endpoints]
  // ~~~~~~~~~~~~~~~~~~~~~~~
  // Kubernetes' probes read GET /healthz and GET /readyz on the metrics port (200: yes, 503: no):
  // - liveness: the launcher answers, and while a worker group runs its supervision loop turns
  //   (every pass calls supervision_turned; a pass waits at most --monitor_interval). A loop that
  //   has not turned for `stall_s` is stuck: the pod should be restarted. Outside a group's run (the
  //   rendezvous, a round's end) the launcher waits on timeouts of its own and is alive.
  // - readiness: a worker group runs and every local worker of it has heartbeated in this attempt
  //   (it is past the rendezvous: DDP heartbeats from its first step) and has not ended. A program
  //   that sends no heartbeats (not the ddp library, no ddp::ProgressReporter) is never ready.
  void supervision_turned(SteadyClock::time_point now);
  void supervision_ended();
  ProbeAnswer liveness(SteadyClock::time_point now, double stall_s) const;
  ProbeAnswer readiness() const;

 private:
  mutable std::mutex mutex_;
  JobProgress job_;
  uid_t worker_uid_;  // workers run as the launcher's user
  std::optional<StragglerDetector> stragglers_;
  std::vector<std::pair<int, StepTiming>> local_timings_;  // recorded, not yet taken
  std::map<int, std::pair<int, std::string>> remote_labels_;  // key -> (rank, host)
};

// "rank 1 (pid 4242, local_rank 1) made no progress for 10 s (last heartbeat at step 5; the other
// ranks are at step 6)".
std::string describe_stuck(const StuckRank& stuck);

// Prometheus text exposition format 0.0.4 of the job, plus one set of series per GPU.
std::string render_prometheus(const JobProgress& job, const std::vector<resources::GpuInfo>& gpus);

}  // namespace ddp::launcher::observe
