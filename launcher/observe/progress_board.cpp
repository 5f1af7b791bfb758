#include "launcher/observe/progress_board.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "ddp/base/str.h"

namespace ddp::launcher::observe {

ProgressBoard::ProgressBoard(int node_rank, int world_size, std::optional<StragglerOptions> stragglers)
    : worker_uid_(::geteuid()) {
  if (stragglers) stragglers_.emplace(*stragglers);
  job_.node_rank = node_rank;
  job_.world_size = world_size;
}

void ProgressBoard::set_membership(int node_rank, int world_size) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_.node_rank = node_rank;
  job_.world_size = world_size;
}

void ProgressBoard::begin_attempt(int attempt, const std::vector<WorkerIdentity>& workers) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_.restarts = attempt;
  job_.ranks.clear();
  if (stragglers_) stragglers_->clear();
  local_timings_.clear();
  for (const auto& w : workers) job_.ranks.emplace_back().worker = w;
}

namespace {

bool finite_non_negative(double v) { return std::isfinite(v) && v >= 0; }

// See Note [Validated progress].
bool plausible(const AgentMessage& m, const RankProgress& r) {
  if (!finite_non_negative(m.timestamp_s)) return false;
  if (m.flags & AgentMessage::kHasStep) {
    if (m.step < 1 || (r.step && m.step < *r.step)) return false;
    if (!finite_non_negative(m.step_time_s) || !finite_non_negative(m.comm_time_s) ||
        !finite_non_negative(m.wait_time_s)) {
      return false;
    }
  }
  if (m.flags & AgentMessage::kHasSamples) {
    if (m.samples < 0 || (r.samples && m.samples < *r.samples)) return false;
  }
  if ((m.flags & AgentMessage::kHasLoss) && !std::isfinite(m.loss)) return false;
  return true;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  for (int digits = 15; digits <= 17; ++digits) {  // the shortest text that reads back exactly
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// Label values escape backslash, double quote and newline (exposition format 0.0.4).
std::string escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

class Exposition {
 public:
  void family(const char* name, const char* type, const char* help) {
    text_ += ddp::str("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
    name_ = name;
  }
  void sample(const std::string& labels, double value) {
    text_ += ddp::str(name_, "{", labels, "} ", number(value), "\n");
  }
  std::string take() { return std::move(text_); }

 private:
  std::string text_;
  std::string name_;
};

}  // namespace

AgentVerdict ProgressBoard::record(const AgentDatagram& datagram, SteadyClock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!datagram.message) {
    ++job_.dropped.malformed;
    return AgentVerdict::kMalformed;
  }
  const AgentMessage& m = *datagram.message;
  // See Note [Agent sender credentials]: the kernel's pid must be the worker's, and the message must
  // claim that worker's rank and pid.
  const auto& sender = datagram.sender;
  auto it = std::find_if(job_.ranks.begin(), job_.ranks.end(),
                         [&](const RankProgress& r) { return r.worker.rank == m.rank && r.worker.pid == m.pid; });
  if (it == job_.ranks.end() || !sender || sender->pid != m.pid || sender->uid != worker_uid_) {
    ++job_.dropped.sender;
    return AgentVerdict::kForeignSender;
  }
  RankProgress& r = *it;
  r.last_heard = now;
  r.heard = true;
  if (!plausible(m, r)) {
    ++job_.dropped.values;
    return AgentVerdict::kInvalidValues;
  }
  if (m.flags & AgentMessage::kHasStep) {
    r.step = m.step;
    r.step_time_s = m.step_time_s;
    r.comm_time_s = m.comm_time_s;
    // The previous iteration's timing (See Note [Stragglers]); the first heartbeat has none.
    if (stragglers_ && m.step > 1 && m.step_time_s > 0) {
      const StepTiming t{m.step - 1, std::max(0.0, m.step_time_s - m.wait_time_s), m.wait_time_s};
      stragglers_->add(m.rank, t);
      if (local_timings_.size() < 4096) local_timings_.emplace_back(m.rank, t);  // bounded if never taken
    }
  }
  if (m.flags & AgentMessage::kHasSamples) {
    // samples/s over windows of at least one second, so that per-step jitter does not show.
    if (!r.samples) {
      r.rate_samples = m.samples;
      r.rate_since = now;
    } else if (now - r.rate_since >= std::chrono::seconds(1)) {
      const double dt = std::chrono::duration<double>(now - r.rate_since).count();
      r.samples_per_second = static_cast<double>(m.samples - r.rate_samples) / dt;
      r.rate_samples = m.samples;
      r.rate_since = now;
    }
    r.samples = m.samples;
  }
  if (m.flags & AgentMessage::kHasLoss) r.loss = m.loss;
  r.timestamp_s = m.timestamp_s;
  return AgentVerdict::kRecorded;
}

void ProgressBoard::mark_exited(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& r : job_.ranks) {
    if (r.worker.rank == rank) r.exited = true;
  }
}

void ProgressBoard::restart_rank(const WorkerIdentity& worker) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& r : job_.ranks) {
    if (r.worker.rank != worker.rank) continue;
    r = RankProgress();
    r.worker = worker;
  }
  if (stragglers_) stragglers_->forget(worker.rank);  // its steps count from 1 again
}

std::vector<std::pair<int, StepTiming>> ProgressBoard::take_local_timings() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(local_timings_, {});
}

void ProgressBoard::add_remote_timings(const std::vector<std::pair<int, StepTiming>>& timings) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stragglers_) return;
  for (const auto& timing : timings) {  // not a structured binding: C++17 lambdas cannot capture one (clang)
    const int rank = timing.first;
    const bool local = std::any_of(job_.ranks.begin(), job_.ranks.end(),
                                   [&](const RankProgress& r) { return r.worker.rank == rank; });
    if (!local) stragglers_->add(rank, timing.second);  // a local rank's own heartbeats are the truth
  }
}

void ProgressBoard::label_remote_rank(int key, int rank, const std::string& host) {
  std::lock_guard<std::mutex> lock(mutex_);
  remote_labels_[key] = {rank, host};
}

std::vector<RankStanding> ProgressBoard::straggler_standings() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stragglers_ ? stragglers_->standings() : std::vector<RankStanding>{};
}

int ProgressBoard::node_rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return job_.node_rank;
}

void ProgressBoard::count_failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++job_.worker_failures;
}

std::vector<StuckRank> ProgressBoard::stuck(SteadyClock::time_point now, double timeout_s) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<StuckRank> out;
  if (timeout_s <= 0) return out;
  std::optional<std::int64_t> lowest;  // the lowest step of the running ranks
  for (const auto& r : job_.ranks) {
    if (r.heard && !r.exited && r.step) lowest = std::min(lowest.value_or(*r.step), *r.step);
  }
  for (const auto& r : job_.ranks) {
    if (!r.heard || r.exited) continue;
    const double silent = std::chrono::duration<double>(now - r.last_heard).count();
    if (silent <= timeout_s) continue;
    if (r.step && lowest && *r.step > *lowest) continue;  // waits for a rank behind it
    StuckRank s;
    s.worker = r.worker;
    s.silent_s = silent;
    s.step = r.step;
    s.whole_world_local = static_cast<int>(job_.ranks.size()) == job_.world_size;
    for (const auto& other : job_.ranks) {
      if (&other == &r || !other.step) continue;
      s.others_min_step = std::min(s.others_min_step.value_or(*other.step), *other.step);
      s.others_max_step = std::max(s.others_max_step.value_or(*other.step), *other.step);
    }
    out.push_back(s);
  }
  return out;
}

void ProgressBoard::supervision_turned(SteadyClock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_.supervising = true;
  job_.last_turn = now;
}

void ProgressBoard::supervision_ended() {
  std::lock_guard<std::mutex> lock(mutex_);
  job_.supervising = false;
}

ProbeAnswer ProgressBoard::liveness(SteadyClock::time_point now, double stall_s) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!job_.supervising) return {true, "ok: no worker group runs now (rendezvous or a round's end, each bounded)"};
  const double since = std::chrono::duration<double>(now - job_.last_turn).count();
  if (since > stall_s) {
    return {false, ddp::str("the supervision loop has not turned for ", static_cast<int>(since), " s (more than ",
                            stall_s, " s)")};
  }
  return {true, ddp::str("ok: supervising ", job_.ranks.size(), " workers")};
}

ProbeAnswer ProgressBoard::readiness() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!job_.supervising || job_.ranks.empty()) return {false, "not ready: no worker group runs now"};
  std::vector<std::string> waiting;
  for (const RankProgress& r : job_.ranks) {
    if (r.exited) {
      waiting.push_back(ddp::str("rank ", r.worker.rank, " has ended"));
    } else if (!r.heard) {
      waiting.push_back(ddp::str("rank ", r.worker.rank, " has not heartbeated yet"));
    }
  }
  if (!waiting.empty()) return {false, "not ready: " + ddp::join(waiting, ", ")};
  return {true, ddp::str("ready: ", job_.ranks.size(), " workers heartbeating")};
}

JobProgress ProgressBoard::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  JobProgress job = job_;
  if (stragglers_) job.stragglers = stragglers_->standings();
  for (RankStanding& standing : job.stragglers) {
    const auto label = remote_labels_.find(standing.rank);
    if (label == remote_labels_.end()) continue;
    standing.rank = label->second.first;
    standing.host = label->second.second;
  }
  return job;
}

std::string describe_stuck(const StuckRank& s) {
  char silent[32];
  std::snprintf(silent, sizeof silent, "%.3g", s.silent_s);
  std::string out = ddp::str("rank ", s.worker.rank, " (pid ", s.worker.pid, ", local_rank ", s.worker.local_rank,
                             ") made no progress for ", silent, " s (last heartbeat at ",
                             s.step ? ddp::str("step ", *s.step) : std::string("no step"));
  if (s.others_min_step) {
    out += ddp::str("; the other ranks", s.whole_world_local ? "" : " on this node", " are at step");
    out += *s.others_min_step == *s.others_max_step ? ddp::str(" ", *s.others_min_step)
                                                    : ddp::str("s ", *s.others_min_step, "..", *s.others_max_step);
  }
  return out + ")";
}

std::string render_prometheus(const JobProgress& job, const std::vector<resources::GpuInfo>& gpus) {
  Exposition e;
  const std::string node = ddp::str("node_rank=\"", job.node_rank, "\"");
  const auto labels = [&](const RankProgress& r) {
    return ddp::str("rank=\"", r.worker.rank, "\",local_rank=\"", r.worker.local_rank, "\",", node);
  };
  // A family lists only the ranks (GPUs) that reported the value.
  const auto family_of_reported = [&](const char* name, const char* type, const char* help, const auto& items,
                                      auto labels_of, auto value_of) {
    bool any = false;
    for (const auto& item : items) {
      const std::optional<double> v = value_of(item);
      if (!v) continue;
      if (!any) e.family(name, type, help);
      any = true;
      e.sample(labels_of(item), *v);
    }
  };
  const auto per_rank = [&](const char* name, const char* type, const char* help, auto value_of) {
    family_of_reported(name, type, help, job.ranks, labels, value_of);
  };
  using Opt = std::optional<double>;
  per_rank("ddp_steps_total", "counter", "Synchronized DDP iterations the rank completed in the current attempt.",
           [](const RankProgress& r) { return r.step ? Opt(static_cast<double>(*r.step - 1)) : Opt(); });
  per_rank("ddp_samples_total", "counter", "Samples the rank trained in the current attempt (reported by the loop).",
           [](const RankProgress& r) { return r.samples ? Opt(static_cast<double>(*r.samples)) : Opt(); });
  per_rank("ddp_samples_per_second", "gauge", "Samples per second of the rank over the last second or more.",
           [](const RankProgress& r) { return r.samples_per_second; });
  per_rank("ddp_step_time_seconds", "gauge", "Wall time of the rank's last completed iteration.",
           [](const RankProgress& r) { return r.step && *r.step > 1 ? Opt(r.step_time_s) : Opt(); });
  per_rank("ddp_communication_time_seconds", "gauge",
           "Gradient all-reduce time of the rank's last completed iteration (first bucket launch to last completion).",
           [](const RankProgress& r) { return r.step && *r.step > 1 ? Opt(r.comm_time_s) : Opt(); });
  per_rank("ddp_loss", "gauge", "Last loss the rank's training loop reported.",
           [](const RankProgress& r) { return r.loss; });
  per_rank("ddp_last_heartbeat_timestamp_seconds", "gauge",
           "Unix time (worker clock) of the rank's last heartbeat.",
           [](const RankProgress& r) { return r.heard ? Opt(r.timestamp_s) : Opt(); });

  // --straggler_action: every current rank of the job (this node's and the others'), See Note [Stragglers].
  if (!job.stragglers.empty()) {
    const auto each = [&](const char* name, const char* help, auto value_of) {
      e.family(name, "gauge", help);
      for (const RankStanding& s : job.stragglers) {
        const std::string host = s.host.empty() ? std::string() : ddp::str("host=\"", escape(s.host), "\",");
        e.sample(ddp::str("rank=\"", s.rank, "\",", host, node), value_of(s));
      }
    };
    each("ddp_straggler_step_ratio", "The rank's median busy time per step over the window, over the median of the other ranks'.",
         [](const RankStanding& s) { return s.ratio; });
    each("ddp_straggler_last_arrival_ratio", "Share of the window's all-reduces the rank arrived at last (waited least).",
         [](const RankStanding& s) { return s.last_share; });
    each("ddp_straggler", "1 when the rank's step ratio is at or over --straggler_factor.",
         [](const RankStanding& s) { return s.straggler ? 1.0 : 0.0; });
  }
  e.family("ddp_restarts_total", "counter", "Restarts of this node's worker group.");
  e.sample(node, job.restarts);
  e.family("ddp_worker_failures_total", "counter",
           "Workers of this node that failed (or that the hang watchdog stopped) on their own.");
  e.sample(node, job.worker_failures);
  e.family("ddp_world_size", "gauge", "Ranks in the job (all nodes).");
  e.sample(node, job.world_size);
  e.family("ddp_launch_agent_messages_dropped_total", "counter",
           "Heartbeat datagrams the launcher dropped: malformed, from a process that is not the rank's worker "
           "(kernel credentials), or with values that cannot be (NaN, negative, a decreasing counter).");
  e.sample(node + ",reason=\"malformed\"", static_cast<double>(job.dropped.malformed));
  e.sample(node + ",reason=\"sender\"", static_cast<double>(job.dropped.sender));
  e.sample(node + ",reason=\"values\"", static_cast<double>(job.dropped.values));

  if (!gpus.empty()) {
    const auto gpu_labels = [](const resources::GpuInfo& g) {
      return ddp::str("gpu=\"", g.index, "\",uuid=\"", escape(g.uuid), "\",name=\"", escape(g.name), "\"");
    };
    e.family("ddp_gpu_memory_used_bytes", "gauge", "GPU memory in use (NVML).");
    for (const auto& g : gpus) e.sample(gpu_labels(g), static_cast<double>(g.total_bytes - std::min(g.total_bytes, g.free_bytes)));
    e.family("ddp_gpu_memory_total_bytes", "gauge", "GPU memory in total (NVML).");
    for (const auto& g : gpus) e.sample(gpu_labels(g), static_cast<double>(g.total_bytes));
    family_of_reported("ddp_gpu_utilization_ratio", "gauge", "Share of the last sample period a kernel ran (NVML), 0..1.",
                       gpus, gpu_labels, [](const resources::GpuInfo& g) { return g.utilization; });
  }
  return e.take();
}

}  // namespace ddp::launcher::observe
