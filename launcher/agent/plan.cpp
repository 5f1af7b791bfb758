#include "launcher/agent/plan.h"

#include <algorithm>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/str.h"
#include "launcher/agent/live_recovery.h"
#include "launcher/process/line_splitter.h"
#include "launcher/process/log_layout.h"

namespace ddp::launcher::agent {

// Note [One plan]
// ~~~~~~~~~~~~~~~
// The dry run and the supervisor must agree on every worker's rank, environment and files, so both
// take them from plan_workers(), a pure function of what was settled before: the configuration
// (flags), the node's assignment (from the rendezvous: node rank, master, world), the local
// resources (GPUs, CPU slices) and the run's folder. Nothing here touches the machine: the
// supervisor makes the folders (log_layout.h) right before it starts the attempt.

namespace {

// --local_ranks_filter and --ranks_filter: a rank is shown when both (those given) name it.
bool shown_on_console(const config::LaunchConfig& c, int local_rank, int rank) {
  if (c.local_ranks_filter) {
    const auto& f = *c.local_ranks_filter;
    if (std::find(f.begin(), f.end(), local_rank) == f.end()) return false;
  }
  if (!c.ranks_filter) return true;
  return std::any_of(c.ranks_filter->begin(), c.ranks_filter->end(),
                     [rank](const std::pair<int, int>& r) { return r.first <= rank && rank <= r.second; });
}

// Which streams of a local rank go to its files: with --log_dir both, else what --redirects and
// --tee name (their files then go to the temporary run folder).
config::StdStreams streams_to_file(const config::LaunchConfig& c, int local_rank) {
  if (!c.log_dir.empty()) return config::StdStreams::kBoth;
  return c.redirects.for_local_rank(local_rank) | c.tee.for_local_rank(local_rank);
}

}  // namespace

bool writes_log_files(const config::LaunchConfig& config, int nproc) {
  for (int lr = 0; lr < nproc; ++lr) {
    if (streams_to_file(config, lr) != config::StdStreams::kNone) return true;
  }
  return false;
}

// Note [Hot spares in ddp_launch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// --spares K (--recovery live) starts K more processes per node, local ranks nproc .. nproc+K-1,
// supervised, restarted and placed (a GPU, CPUs) as workers are. Each gets DDP_LIVE_SPARE=1 and a
// member id of its own; ddp::live_job_from_environment makes it a spare, whose FaultTolerant::start()
// waits in the job's spare pool until a lost worker's place is its (See Note [Hot spares] in
// ddp/elastic/membership.h). It has no rank until then: RANK and LOCAL_RANK are its node's first
// worker's (the torchrun variables stay valid), and its files, log lines and heartbeats
// (DDP_AGENT_RANK) are numbered after the world's ranks (node_rank * K + the spare's index, plus
// the world size). A process of the job
// that dies (a worker or a spare) is marked gone (mark_node_gone marks a node's or a worker's
// unclaimed spares in the pool too) and restarted as a spare, within --max_restarts: the spare that
// took its place trains on, and the pool is whole again. A host lost takes its spares with it. The
// world size the workers see stays nnodes x nproc.
std::vector<process::WorkerLaunch> plan_workers(const config::LaunchConfig& c, const rendezvous::NodeAssignment& node, const LocalWorkers& local,
                                       const RunContext& run, int attempt, bool respawn) {
  std::vector<process::WorkerLaunch> group;
  for (int lr = 0; lr < local.nproc + local.spares; ++lr) {
    const bool spare = lr >= local.nproc || (respawn && local.spares > 0);
    // Numbered by place, not by role: a worker restarted as a spare keeps its rank's number.
    const int rank = lr >= local.nproc ? node.nnodes * local.nproc + node.node_rank * local.spares + (lr - local.nproc)
                                       : global_rank(node, lr);
    const process::WorkerFiles files = process::worker_files(run.run_folder, attempt, rank);
    WorkerSlot slot;
    slot.local_rank = lr;
    slot.restart_count = attempt;
    slot.error_file = files.error_file;
    // Diagnostics of the ddp library (collectives-rank<R>.json), side by side for every rank.
    if (!c.log_dir.empty()) slot.log_dir = process::attempt_dir(run.run_folder, attempt);
    if (!local.gpus.empty()) slot.visible_gpu = local.gpus[lr];
    slot.virtual_local_rank = c.virtual_local_rank;
    slot.signals_to_handle = c.signals_to_handle;
    slot.agent_socket = run.agent_socket;
    if (lr >= local.nproc) slot.agent_rank = rank;  // its RANK is its node's first worker's
    slot.join_timeout_s = c.rdzv_timeout_s;  // See Note [Waiting is never silent] in ddp/distributed/detail/join_wait.h
    if (!local.cpu_slices.empty()) slot.cpus = local.cpu_slices[lr];
    if (c.recovery == config::Recovery::kLive) {  // See Note [Live recovery with ddp_launch] in launcher/agent/live_recovery.cpp
      slot.live = WorkerSlot::LivePlace{ddp::str(c.rdzv_host, ":", c.rdzv_port), live_store_prefix(c),
                                        ddp::str(node.live_node_key.empty() ? ddp::str("node", node.node_rank)
                                                                            : node.live_node_key,
                                                 "/local", lr, "/attempt", attempt),
                                        spare};
    }
    process::WorkerLaunch w;
    w.local_rank = lr;
    w.rank = rank;
    w.cpus = slot.cpus;
    w.console_prefix = process::line_prefix(c.log_line_prefix_template, {c.role, rank, lr, run.host_name});
    w.env = worker_environment(run.inherited, node, slot);
    w.launcher_set = launcher_variables(node, slot);
    if (auto omp = omp_threads_default(run.inherited, local.nproc, slot)) w.launcher_set.emplace_back(ddp::env::kOmpNumThreads, *omp);
    w.dir = files.dir;
    w.error_file = files.error_file;
    const config::StdStreams redirected = c.redirects.for_local_rank(lr);
    const config::StdStreams teed = c.tee.for_local_rank(lr);
    const config::StdStreams to_file = streams_to_file(c, lr);
    const bool shown = shown_on_console(c, lr, rank);
    constexpr config::StdStreams kOut = config::StdStreams::kOut;
    constexpr config::StdStreams kErr = config::StdStreams::kErr;
    w.stdout_to_console = shown && (!config::includes(redirected, kOut) || config::includes(teed, kOut));
    w.stderr_to_console = shown && (!config::includes(redirected, kErr) || config::includes(teed, kErr));
    if (config::includes(to_file, kOut)) w.stdout_log = files.stdout_log;
    if (config::includes(to_file, kErr)) w.stderr_log = files.stderr_log;
    // As torchrun's, the filters read the tee'd streams only.
    if (!c.duplicate_stdout_filters.empty() && config::includes(teed, kOut)) {
      w.filtered_stdout_log = process::attempt_dir(run.run_folder, attempt) + "/filtered_stdout.log";
    }
    if (!c.duplicate_stderr_filters.empty() && config::includes(teed, kErr)) {
      w.filtered_stderr_log = process::attempt_dir(run.run_folder, attempt) + "/filtered_stderr.log";
    }
    group.push_back(std::move(w));
  }
  return group;
}

std::vector<process::WorkerLaunch> prepare_attempt(const config::LaunchConfig& config, const rendezvous::NodeAssignment& node,
                                          const LocalWorkers& local, const RunContext& run, int attempt) {
  std::vector<process::WorkerLaunch> group = plan_workers(config, node, local, run, attempt);
  process::make_new_dir(process::attempt_dir(run.run_folder, attempt));
  for (const process::WorkerLaunch& w : group) process::make_new_dir(w.dir);
  return group;
}

}  // namespace ddp::launcher::agent
