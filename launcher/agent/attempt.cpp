#include "launcher/agent/attempt.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <spdlog/spdlog.h>

#include "ddp/base/detail/files.h"
#include "ddp/base/str.h"
#include "launcher/observe/agent_socket.h"
#include "launcher/channel/job_link.h"
#include "launcher/observe/progress_board.h"
#include "launcher/process/spawn.h"

// Note [Supervision]
// ~~~~~~~~~~~~~~~~~~
// One thread, one poll() loop per attempt: the worker pipes plus a self-pipe that the signal handler
// writes the signal number to (so SIGCHLD and forwarded signals wake the loop at once; poll's timeout
// is --monitor_interval, which bounds how late deadlines are noticed).
// Each worker is fork()ed and execve()d directly (no shell), in a session and process group of its
// own (setsid): signals reach the worker and everything it started, a terminal's Ctrl-C reaches only
// the launcher, which forwards it, and the kernel's autogroup scheduler treats each worker like any
// other session. In one shared session, as with a plain setpgid, all the workers of a busy machine
// together get the CPU share of one session: measured here as 0.64-0.70x the samples/s of the same
// binary under torchrun (which also starts each worker in a new session). The parent does not call
// setpgid: had it won the race, the child's setsid would fail (it would lead a process group
// already); signal_group() covers the instant before the child's setsid instead.
// In the child, prctl(PR_SET_PDEATHSIG, SIGKILL) ties the worker's life to the
// launcher; since the launcher may die between fork() and prctl(), the child then checks that its
// parent is still the launcher and exits if not. The child closes every descriptor above stderr
// (as torchrun's Popen(close_fds=True)): libraries in the launcher (the metrics plugin's HTTP
// server) open sockets without O_CLOEXEC, and a worker must not keep the launcher's port bound.
// Only async-signal-safe calls run in the child: every string execve needs is built before fork().
// Stopping a group: SIGTERM to every worker's process group, then SIGKILL after --shutdown_grace.
// At the end of an attempt, every worker's process group gets SIGKILL, so grandchildren a worker
// started do not outlive it.

// Note [Unreapable workers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// SIGKILL ends a process only when it leaves the kernel: one stuck in an uninterruptible sleep
// (state D: a hung NFS or GPU driver call) stays, and a sandbox may delay the reaping of a zombie.
// Waiting for such a worker would hang the launcher, and with it the job's end and every other
// node's restart. So the wait after SIGKILL is bounded (SupervisorOptions::reap_timeout_s): then the
// launcher logs the worker's pid and its state from /proc/PID/stat, records it as a failure
// (WorkerExit::unreaped), stops waiting for it and, since its GPU memory and files may still be
// held, does not restart the group: the launcher exits non-zero. The wait is a WNOHANG poll inside
// the loop (never a blocking waitpid), also when start-up failed half-way.

namespace ddp::launcher::agent {
namespace {

struct Worker {
  process::WorkerLaunch launch;
  pid_t pid = -1;
  bool running = false;
  bool unreaped = false;  // given up on after SIGKILL (See Note [Unreapable workers])
  std::optional<size_t> hang_failure;  // index in Attempt::failures when the watchdog stopped it
  std::optional<std::string> hang_killed;  // --recovery live: the watchdog killed it alone (its line)
  process::OutputStream out;
  process::OutputStream err;
};

using Clock = std::chrono::steady_clock;

// The job channel as the straggler report's peers, in restart-based rounds: ranks are unique in a
// round, node 0's launcher names every rank.
class JobLinkStragglers : public observe::StragglerPeers {
 public:
  JobLinkStragglers(channel::JobLink& link, int node_rank) : link_(link), node_rank_(node_rank) {}
  std::vector<std::pair<int, observe::StepTiming>> exchange(int round,
                                                            const std::vector<std::pair<int, observe::StepTiming>>& local) override {
    link_.publish_timings(round, observe::encode_timings(local));
    std::vector<std::pair<int, observe::StepTiming>> remote;
    for (const std::string& items : link_.take_timings(round)) {
      const auto decoded = observe::decode_timings(items);
      remote.insert(remote.end(), decoded.begin(), decoded.end());
    }
    return remote;
  }
  std::string name_of(int key) const override { return link_.name_of_rank(key); }
  bool names_every_rank() const override { return node_rank_ == 0; }
  std::optional<std::string> leave(int round, const std::string& why) override {
    link_.report_failure(round, why);
    return std::nullopt;
  }

 private:
  channel::JobLink& link_;
  int node_rank_;
};

std::optional<std::chrono::system_clock::time_point> file_mtime(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return std::nullopt;
  const auto since_epoch = std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec);
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(since_epoch));
}

class Attempt {
 public:
  Attempt(const SupervisorOptions& options, process::SignalPipe& signals, int attempt, std::vector<process::WorkerLaunch> launches)
      : options_(options), signals_(signals), attempt_(attempt) {
    int shown_out = 0;
    int shown_err = 0;
    for (auto& l : launches) {
      shown_out += l.stdout_to_console ? 1 : 0;
      shown_err += l.stderr_to_console ? 1 : 0;
      workers_.emplace_back();
      workers_.back().launch = std::move(l);
    }
    if (options_.collapse_window_s > 0) {  // See Note [Collapsed lines]
      const std::chrono::milliseconds window(static_cast<long long>(options_.collapse_window_s * 1000));
      collapse_out_.emplace(STDOUT_FILENO, shown_out, window);
      collapse_err_.emplace(STDERR_FILENO, shown_err, window);
    } else if (const std::size_t width = process::terminal_width(STDOUT_FILENO); width > 0) {
      terminal_progress_.emplace(width);
    }
  }

  // Only reached with workers still running when start-up failed half-way (an exception).
  ~Attempt() {
    const auto deadline = process::after_seconds(options_.reap_timeout_s);
    for (auto& w : workers_) {
      if (w.running && w.pid > 0) process::signal_group(w.pid, SIGKILL);
    }
    for (auto& w : workers_) {
      int status = 0;
      bool reaped = !w.running || w.pid <= 0;
      while (!reaped && Clock::now() < deadline) {
        reaped = try_reap(w.pid, &status) == w.pid;
        if (!reaped) ::poll(nullptr, 0, 10);
      }
      if (!reaped) {
        spdlog::error("rank {} (pid {}) was not reaped {} s after SIGKILL: state {}", w.launch.rank, w.pid,
                      options_.reap_timeout_s, process::process_state(w.pid));
      }
      w.out.close_all();
      w.err.close_all();
    }
  }
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  AttemptOutcome run() {
    start_all();
    while (true) {
      if (options_.progress != nullptr) options_.progress->supervision_turned(Clock::now());  // Note [Health endpoints]
      handle_signals();
      reap();
      check_hangs();
      follow_job();
      check_stragglers();
      if (stop_deadline_ && Clock::now() >= *stop_deadline_ && !killed_) kill_all(SIGKILL);
      if (reap_deadline_ && Clock::now() >= *reap_deadline_) give_up_on_unreaped();
      if (running_count() == 0) break;
      wait_for_events(next_timeout_ms());
      flush_collapsed(false);
    }
    if (options_.progress != nullptr) options_.progress->supervision_ended();
    drain_output();
    // Grandchildren left in a worker's process group go too (See Note [Supervision]).
    for (auto& w : workers_) {
      if (w.pid > 0) ::kill(-w.pid, SIGKILL);  // reaped (or unreaped): never the pid itself, it may be reused
    }
    return {std::move(failures), launcher_signal, unreaped_, stopped_by_, replaced_};
  }

 private:
  std::vector<WorkerExit> failures;
  std::optional<int> launcher_signal;

  // The attempt's filtered_std{out,err}.log, created once and shared by its workers.
  int filtered_file(const std::string& path) {
    if (path.empty()) return -1;
    auto it = filtered_files_.find(path);
    if (it == filtered_files_.end()) it = filtered_files_.emplace(path, ddp::detail::create_new_file(path, 0600, true)).first;
    return it->second.get();
  }

  void start_all() {
    for (auto& w : workers_) start(w);
    if (options_.progress != nullptr) {
      std::vector<observe::WorkerIdentity> ids;
      for (const auto& w : workers_) ids.push_back({w.launch.rank, w.launch.local_rank, static_cast<int>(w.pid)});
      options_.progress->begin_attempt(attempt_, ids);
    }
  }

  void start(Worker& w) {
    const int filtered_out = filtered_file(w.launch.filtered_stdout_log);
    const int filtered_err = filtered_file(w.launch.filtered_stderr_log);
    w.pid = process::start_worker(options_.program_path, options_.program_args, w.launch, w.out, w.err);
    w.out.filtered_fd = filtered_out;
    w.out.filters = &options_.duplicate_stdout_filters;
    w.err.filtered_fd = filtered_err;
    w.err.filters = &options_.duplicate_stderr_filters;
    w.out.live = w.err.live = terminal_progress_ ? &*terminal_progress_ : nullptr;  // See Note [Progress on a terminal]
    w.out.collapser = collapse_out_ ? &*collapse_out_ : nullptr;
    w.err.collapser = collapse_err_ ? &*collapse_err_ : nullptr;
    w.running = true;
  }

  // See Note [Hang watchdog] in launcher/observe/progress_board.h: a stuck rank fails the attempt like a crash;
  // its failure is recorded now (the root cause) and completed when the worker is reaped.
  void check_hangs() {
    if (options_.hang_timeout_s <= 0 || options_.progress == nullptr || stopping_) return;
    const auto stuck = options_.progress->stuck(Clock::now(), options_.hang_timeout_s);
    if (stuck.empty()) return;
    if (options_.respawn_worker) {
      // --recovery live: a stuck worker is a dead one that has not noticed. It alone is killed
      // (SIGKILL: it does not step, and its peers recover without it) and restarted as a dead
      // worker is (See Note [Restarting one live worker] in launcher/agent/live_respawn.h).
      for (const auto& s : stuck) {
        for (auto& w : workers_) {
          if (w.launch.rank != s.worker.rank || !w.running || w.hang_killed) continue;
          w.hang_killed = observe::describe_stuck(s);
          spdlog::error("{} (--hang_timeout {} s): killing it, to restart it alone (--recovery live)", *w.hang_killed,
                        options_.hang_timeout_s);
          process::signal_group(w.pid, SIGKILL);
        }
      }
      return;
    }
    for (const auto& s : stuck) {
      std::string line = observe::describe_stuck(s);
      if (options_.link != nullptr) line += options_.link->describe_behind(attempt_, local_steps());
      spdlog::error("{} (--hang_timeout {} s): stopping the job", line, options_.hang_timeout_s);
      for (auto& w : workers_) {
        if (w.launch.rank != s.worker.rank || !w.running) continue;
        WorkerExit exit = exit_record(w);
        exit.exit_code = 1;  // until the worker is reaped
        exit.hang = line;
        w.hang_failure = failures.size();
        failures.push_back(std::move(exit));
        options_.progress->count_failure();
      }
    }
    if (options_.link != nullptr) {
      options_.link->report_failure(attempt_, observe::describe_stuck(stuck.front()) +
                                                  options_.link->describe_behind(attempt_, local_steps()) +
                                                  " (--hang_timeout)");
    }
    begin_stop(true, "the hang watchdog stopped the job");
  }

  // --straggler_action warn (See Note [Stragglers] in launcher/observe/straggler.h): timings go to and
  // come from the other nodes; one launcher names every straggler (node 0's, or the live job's
  // store host's), the others their own ranks. A rank is named once when it becomes one, and said to
  // be one no longer when its ratio falls back below the middle of 1 and the factor (so a ratio
  // hovering at the factor is not named at every pass).
  void check_stragglers() {
    observe::ProgressBoard* board = options_.progress;
    if (board == nullptr || !board->watches_stragglers()) return;
    const auto now = Clock::now();
    if (now - stragglers_checked_ < std::chrono::milliseconds(100)) return;
    stragglers_checked_ = now;
    const auto local = board->take_local_timings();
    observe::StragglerPeers* peers = straggler_peers();
    if (peers != nullptr) {
      const auto remote = peers->exchange(attempt_, local);
      for (const auto& timing : remote) {
        if (!labelled_keys_.insert(timing.first).second) continue;  // once per key
        if (const auto label = peers->rank_and_host(timing.first)) board->label_remote_rank(timing.first, label->first, label->second);
      }
      board->add_remote_timings(remote);
    }
    const observe::StragglerOptions& o = board->straggler_options();
    const bool names_all = peers == nullptr || peers->names_every_rank();
    for (const observe::RankStanding& s : board->straggler_standings()) {
      const bool ours = std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) { return w.launch.rank == s.rank; });
      if (!names_all && !ours) continue;
      const std::string name = peers != nullptr ? peers->name_of(s.rank) : ddp::str("rank ", s.rank, " on ", options_.host_name);
      if (s.straggler && named_stragglers_.insert(s.rank).second) {
        const std::string straggler = observe::describe_straggler(s, o.window, name);
        spdlog::warn("straggler: {} (--straggler_factor {})", straggler, o.factor);
        if (ours && options_.replace_stragglers) replace_straggler(straggler);
      } else if (s.ratio < (1 + o.factor) / 2 && named_stragglers_.erase(s.rank) > 0) {
        spdlog::info("no longer a straggler: {}", observe::describe_straggler(s, o.window, name));
      }
    }
  }

  observe::StragglerPeers* straggler_peers() {
    if (options_.straggler_peers != nullptr) return options_.straggler_peers;
    if (options_.link != nullptr && !link_stragglers_) link_stragglers_.emplace(*options_.link, options_.progress->node_rank());
    return link_stragglers_ ? &*link_stragglers_ : nullptr;
  }

  // Note [Replacing a straggler]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // --straggler_action replace treats a rank named a straggler as lost, the way a slow host is
  // handled by hand: its launcher (the only one that acts on it; another names it too) tells the
  // other launchers, stops its own workers and leaves the job, exiting 0 (a scheduler that restarts
  // failed tasks must not bring the slow host back; its line says why it left).
  //   - In restart-based elastic rounds the job channel carries the word: the other launchers stop
  //     their groups as for a failure and go on in the next round without this node (or with a
  //     node that waited for a place at --nnodes MAX: a spare host), resumed from the training's
  //     checkpoint, as after any loss.
  //   - In a live job (--recovery live) the launcher marks its workers gone in the training's
  //     membership before it stops them (LiveStragglerPeers in launcher/agent/live_recovery.cpp), so
  //     the others regroup at once without them: a hot spare (--spares) takes each place and the
  //     world size stays, or the world shrinks, as after a host's loss; no checkpoint is read. The
  //     launcher that serves the job's store cannot leave (the job needs its store): its stragglers
  //     are only named.
  void replace_straggler(const std::string& straggler) {
    if (stopping_ || replaced_) return;
    const std::string why = ddp::str("--straggler_action replace: ", straggler, "; this node leaves the job");
    observe::StragglerPeers* peers = straggler_peers();
    if (const auto stays = peers != nullptr ? peers->leave(attempt_, why) : std::nullopt) {
      spdlog::warn("--straggler_action replace: {}", *stays);
      return;
    }
    replaced_ = why;
    begin_stop(true, "--straggler_action replace: this node leaves the job");
  }

  // This node's ranks' last reported steps.
  std::vector<std::pair<int, std::int64_t>> local_steps() const {
    std::vector<std::pair<int, std::int64_t>> steps;
    if (options_.progress == nullptr) return steps;
    for (const observe::RankProgress& r : options_.progress->snapshot().ranks) {
      if (r.step) steps.emplace_back(r.worker.rank, *r.step);
    }
    return steps;
  }

  // See Note [Coordinated restarts]: another node's failure (or loss) stops this group too; with
  // the hang watchdog on, this node's progress goes to the others.
  void follow_job() {
    if (options_.link != nullptr) follow_link();
    if (options_.membership_change && !stopping_) {  // See Note [Elastic rounds] in launcher/rendezvous/rounds.cpp
      if (const auto change = options_.membership_change()) {
        if (failures.empty()) stopped_by_ = *change;
        spdlog::warn("{}", *change);
        begin_stop(true, "the job's membership changes");
      }
    }
  }

  void follow_link() {
    options_.link->pump();
    if (const auto stop = options_.link->take_stop(attempt_)) {
      if (!stopping_ && failures.empty()) stopped_by_ = *stop;
      if (!stopping_) {
        spdlog::warn("{}", *stop);
        begin_stop(true, "the job stopped on another host");
      }
    }
    if (options_.hang_timeout_s > 0 && !stopping_) options_.link->publish_progress(attempt_, local_steps());
  }

  int running_count() const {
    return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
  }

  void flush_collapsed(bool all) {
    for (auto* c : {&collapse_out_, &collapse_err_}) {
      if (!*c) continue;
      if (all) (*c)->flush_all();
      else (*c)->flush_due(Clock::now());
    }
  }

  int next_timeout_ms() const {
    int ms = std::max(1, static_cast<int>(options_.monitor_interval_s * 1000));
    for (const auto* c : {&collapse_out_, &collapse_err_}) {  // a held line leaves on time
      const int due = *c ? (*c)->ms_until_due(Clock::now()) : -1;
      if (due >= 0) ms = std::min(ms, due);
    }
    if (options_.link != nullptr || options_.membership_change) ms = std::min(ms, 250);  // its pings (See Note [Coordinated restarts])
    const auto until = [&](Clock::time_point deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      ms = std::min<long long>(ms, std::max<long long>(0, left + 1));
    };
    if (stop_deadline_ && !killed_) until(*stop_deadline_);
    if (reap_deadline_) until(*reap_deadline_);
    return ms;
  }

  pid_t try_reap(pid_t pid, int* status) const {
    return options_.try_reap ? options_.try_reap(pid, status) : ::waitpid(pid, status, WNOHANG);
  }

  // See Note [Unreapable workers]: the workers still not reaped reap_timeout_s after SIGKILL.
  void give_up_on_unreaped() {
    for (auto& w : workers_) {
      if (!w.running) continue;
      const std::string state = process::process_state(w.pid);
      spdlog::error("rank {} (pid {}) was not reaped {} s after SIGKILL: state {} (from /proc/{}/stat); giving up "
                    "on it, the group is not restarted",
                    w.launch.rank, w.pid, options_.reap_timeout_s, state, w.pid);
      w.running = false;
      w.unreaped = true;
      unreaped_ = true;
      if (options_.progress != nullptr) options_.progress->mark_exited(w.launch.rank);
      if (w.hang_failure) {
        failures[*w.hang_failure].unreaped = state;
        continue;
      }
      WorkerExit exit = exit_record(w);
      exit.exit_code = 1;
      exit.unreaped = state;
      exit.after_stop = true;
      exit.observed_pass = pass_;
      failures.push_back(std::move(exit));
    }
    reap_deadline_.reset();
  }

  // poll() on the signal pipe and every open output pipe; reads what is ready.
  void wait_for_events(int timeout_ms) {
    std::vector<pollfd> fds{{signals_.read_fd(), POLLIN, 0}};
    std::vector<process::OutputStream*> streams;
    for (auto& w : workers_) {
      for (process::OutputStream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
    }
    const int agent_fd = options_.agent != nullptr ? options_.agent->fd() : -1;
    const int link_fd = options_.link != nullptr ? options_.link->poll_fd() : -1;
    if (link_fd >= 0) fds.push_back({link_fd, options_.link->poll_events(), 0});
    if (agent_fd >= 0) fds.push_back({agent_fd, POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n <= 0) return;
    for (size_t i = 1; i < streams.size() + 1; ++i) {
      if (fds[i].revents != 0) streams[i - 1]->pump();
    }
    if (agent_fd >= 0 && fds.back().revents != 0) {
      const auto now = Clock::now();
      options_.agent->drain([&](const observe::AgentDatagram& d) { options_.progress->record(d, now); });
    }
  }

  // Note [A signal during a failed stop]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A signal that comes while the group is already stopping because a worker failed (its --shutdown_grace)
  // hurries the stop and ends the restarts, but the job failed because of that worker: the launcher
  // exits with the worker's code, not 128 + the signal. On hosts this is the common case, not a rare
  // one: the host launcher of the failed rank is told to stop (its stdin closed, read as SIGTERM) as
  // soon as any other host ends, often within its grace. Exiting 143 there made the job's exit code
  // 143 instead of the root cause's (launcher.process_hosts failed so 2 of 12 runs under load).
  // No flag is needed: the signal starts the stop, so a failure seen before it is the one failure
  // not after_stop, and the root cause when there is one (Note [Root cause]).
  void handle_signals() {
    for (int sig : signals_.drain()) {
      if (sig == SIGCHLD) continue;
      if (!launcher_signal) launcher_signal = sig;
      spdlog::warn("received {}: forwarding it to {} workers", process::signal_name(sig), running_count());
      for (auto& w : workers_) {
        if (w.running) process::signal_group(w.pid, sig);
      }
      begin_stop(false);
    }
  }

  static WorkerExit exit_record(const Worker& w) {
    WorkerExit exit;
    exit.rank = w.launch.rank;
    exit.local_rank = w.launch.local_rank;
    exit.pid = w.pid;
    exit.time = std::chrono::system_clock::now();
    exit.error_file = w.launch.error_file;
    return exit;
  }

  void reap() {
    ++pass_;
    const bool stopping_before = stopping_;  // failures of this pass all count as before the stop
    bool failed = false;
    std::vector<WorkerExit> to_respawn;
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      const pid_t r = try_reap(w.pid, &status);
      if (r != w.pid) continue;
      w.running = false;
      if (options_.progress != nullptr) options_.progress->mark_exited(w.launch.rank);
      if (w.hang_failure) {  // stopped by the watchdog: complete its record, it stays the root cause
        WorkerExit& hung = failures[*w.hang_failure];
        if (WIFSIGNALED(status)) hung.signal = WTERMSIG(status);
        else hung.exit_code = WEXITSTATUS(status) != 0 ? WEXITSTATUS(status) : 1;
        hung.error = detail::read_error_file(hung.error_file);
        continue;
      }
      WorkerExit exit = exit_record(w);
      if (WIFSIGNALED(status)) exit.signal = WTERMSIG(status);
      else exit.exit_code = WEXITSTATUS(status);
      exit.hang = w.hang_killed;
      if (!exit.signal && exit.exit_code == 0) continue;
      exit.error = detail::read_error_file(exit.error_file);
      if (exit.error) exit.error_written = file_mtime(exit.error_file);
      exit.after_stop = stopping_before;
      exit.observed_pass = pass_;
      if (!stopping_before && options_.respawn_worker) {  // See Note [Restarting one live worker]
        to_respawn.push_back(std::move(exit));
        continue;
      }
      if (!stopping_before && options_.progress != nullptr) options_.progress->count_failure();
      if (!stopping_before && options_.link != nullptr) {
        options_.link->report_failure(attempt_, ddp::str("rank ", exit.rank, " exited with ", describe_exit(exit)));
      }
      failures.push_back(std::move(exit));
      failed = true;
    }
    for (WorkerExit& exit : to_respawn) failed = !respawn(std::move(exit)) || failed;
    if (failed) begin_stop(true);
  }

  // --recovery live: starts a new process for the failed worker alone (its node-mates keep running),
  // or, when restarts are used up, records its failure (the caller stops the group). The dead
  // worker's entry stays (not running) for its output and its process group's final SIGKILL.
  bool respawn(WorkerExit exit) {
    if (options_.progress != nullptr) options_.progress->count_failure();
    std::optional<process::WorkerLaunch> launch = options_.respawn_worker(exit.local_rank);
    if (!launch) {
      failures.push_back(std::move(exit));
      return false;
    }
    spdlog::warn("rank {} (local rank {}, pid {}) exited with {}: restarting it alone (--recovery live); the other "
                 "workers keep running",
                 exit.rank, exit.local_rank, exit.pid, describe_exit(exit));
    workers_.emplace_back();  // a deque: the other workers' streams stay where they are
    workers_.back().launch = std::move(*launch);
    start(workers_.back());
    if (options_.progress != nullptr) {
      const Worker& w = workers_.back();
      options_.progress->restart_rank({w.launch.rank, w.launch.local_rank, static_cast<int>(w.pid)});
    }
    return true;
  }

  // The group stops: SIGTERM to every running worker (unless a forwarded signal already went out),
  // SIGKILL when the grace period is over.
  void begin_stop(bool send_sigterm, const char* why = "a worker failed") {
    if (stopping_) return;
    if (send_sigterm && running_count() > 0) {
      spdlog::warn("{}: sending SIGTERM to the {} running workers (SIGKILL after {} s)", why, running_count(),
                   options_.shutdown_grace_s);
      for (auto& w : workers_) {
        if (w.running) process::signal_group(w.pid, SIGTERM);
      }
    }
    stopping_ = true;
    stop_deadline_ = process::after_seconds(options_.shutdown_grace_s);
  }

  void kill_all(int sig) {
    killed_ = true;
    reap_deadline_ = process::after_seconds(options_.reap_timeout_s);
    for (auto& w : workers_) {
      if (w.running) {
        spdlog::warn("rank {} (pid {}) still running after the {} s grace period: sending {}", w.launch.rank,
                     w.pid, options_.shutdown_grace_s, process::signal_name(sig));
        process::signal_group(w.pid, sig);
      }
    }
  }

  // Workers are gone; read what is left in their pipes (bounded: a grandchild may hold a pipe open).
  void drain_output() {
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (Clock::now() < deadline) {
      bool open = false;
      for (auto& w : workers_) open = open || w.out.fd >= 0 || w.err.fd >= 0;
      if (!open) break;
      wait_for_events(50);
      signals_.drain();
    }
    for (auto& w : workers_) {
      w.out.finish();
      w.err.finish();
    }
    flush_collapsed(true);
  }

  const SupervisorOptions& options_;
  process::SignalPipe& signals_;
  int attempt_;
  // --collapse_lines, one per console stream; declared before workers_: outlives their streams.
  std::optional<process::LineCollapser> collapse_out_;
  std::optional<process::LineCollapser> collapse_err_;
  std::map<std::string, ddp::detail::FileDescriptor> filtered_files_;  // declared before workers_: outlives their streams
  // When the launcher's stdout is a terminal (See Note [Progress on a terminal]); before workers_ too.
  std::optional<process::TerminalProgress> terminal_progress_;
  std::deque<Worker> workers_;
  bool stopping_ = false;
  bool killed_ = false;
  int pass_ = 0;
  std::optional<Clock::time_point> stop_deadline_;
  std::optional<Clock::time_point> reap_deadline_;  // SIGKILL sent: see Note [Unreapable workers]
  bool unreaped_ = false;
  std::optional<std::string> stopped_by_;  // See Note [Coordinated restarts]
  Clock::time_point stragglers_checked_;
  std::set<int> named_stragglers_;  // ranks named as stragglers (See check_stragglers)
  std::set<int> labelled_keys_;     // other nodes' keys whose rank and host the board has
  std::optional<std::string> replaced_;  // See Note [Replacing a straggler]
  std::optional<JobLinkStragglers> link_stragglers_;
};

}  // namespace

AttemptOutcome run_attempt(const SupervisorOptions& options, process::SignalPipe& signals, int attempt,
                           std::vector<process::WorkerLaunch> launches) {
  Attempt run(options, signals, attempt, std::move(launches));
  return run.run();
}

}  // namespace ddp::launcher::agent
