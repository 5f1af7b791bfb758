#include "launcher/hosts/remote_launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <spdlog/spdlog.h>
#include <thread>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "ddp/base/str.h"
#include "launcher/agent/failure_report.h"
#include "launcher/hosts/hostfile.h"
#include "launcher/process/line_splitter.h"
#include "launcher/hosts/remote_command.h"
#include "launcher/process/spawn.h"
#include "launcher/process/worker_process.h"

namespace ddp::launcher::hosts {
namespace {

using Clock = std::chrono::steady_clock;
using process::after_seconds;
using process::close_fd;

// Note [Start-up check]
// ~~~~~~~~~~~~~~~~~~~~~
// A host that cannot take part must be named before any host starts training, not found out as a
// rendezvous that never completes. So every host first runs its own command line with --dry_run
// in place of --watch_stdin (all hosts at once, bounded by kCheckTimeoutS): that logs in (an
// unreachable host, a refused key, a host key not in known_hosts: ssh's exit 255 and its last
// line), finds the working directory and ddp_launch at the same paths (the shell's line), and runs
// ddp_launch's whole flag check on that host, which resolves the training binary in that host's
// PATH ("training binary './train' does not exist"). Each failed host gives one line naming it;
// the job exits 2. It costs one more ssh login per host, in parallel.
constexpr double kCheckTimeoutS = 60;
// Stopping: after the remote launchers' own --shutdown_grace, this long for ssh to bring their
// last words back before the --ssh_cmd processes get SIGTERM (which ends a pdsh, See Note
// [Stopping the hosts]), and as long again before SIGKILL.
constexpr double kStopSlackS = 5;
// After SIGKILL (or all exits), this long for the pipes to close (a process ssh left behind could
// hold them open).
constexpr double kDrainS = 5;
constexpr size_t kMaxHostListBytes = 1 << 20;
constexpr size_t kLastLines = 4;

struct HostNode {
  HostSlots slots;
  int node_rank = 0;
  std::string run_line;    // what the host runs
  std::string check_line;  // the same with --dry_run (Note [Start-up check])
};

std::string this_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw ddp::Error(ddp::str("cannot find ddp_launch's own path (/proc/self/exe): ", std::strerror(errno)));
  return std::string(buf, static_cast<size_t>(n));
}

std::string working_directory() {
  char buf[4096];
  if (::getcwd(buf, sizeof buf) == nullptr) {
    throw ddp::Error(ddp::str("cannot read the working directory: ", std::strerror(errno)));
  }
  return buf;
}

// A host list or .ddp_env, whole; one that cannot be read is a usage error naming `what`.
std::string read_list_file(const std::string& path, const std::string& what) {
  try {
    return ddp::detail::read_file(path, kMaxHostListBytes);
  } catch (const ddp::IoError& e) {
    throw UsageError(ddp::str(what, ": ", e.what()));
  }
}

// The forwarded variables: the .ddp_env file of the working directory, then each --env NAME with
// this launcher's value (a name in both: --env's value).
std::vector<std::pair<std::string, std::string>> forwarded_env(const config::LaunchConfig& c, const EnvironmentSnapshot& env) {
  std::vector<std::pair<std::string, std::string>> out;
  if (::access(".ddp_env", F_OK) == 0) out = parse_env_file(read_list_file(".ddp_env", ".ddp_env"), ".ddp_env");
  for (const std::string& name : flag_values(c.launcher_args, "env")) {
    if (!is_env_name(name)) throw UsageError(ddp::str("--env '", name, "' is not a variable name (--env NAME)"));
    const auto value = env.get(name);
    if (!value) throw UsageError(ddp::str("--env ", name, ": ", name, " is not set here, so there is nothing to forward"));
    out.erase(std::remove_if(out.begin(), out.end(), [&](const auto& kv) { return kv.first == name; }), out.end());
    out.emplace_back(name, *value);
  }
  return out;
}

std::vector<HostSlots> read_hosts(const config::LaunchConfig& c) {
  if (!c.hostfile.empty() && !c.hosts.empty()) throw UsageError("--hostfile and --hosts exclude each other: give one");
  std::vector<HostSlots> hosts = c.hostfile.empty() ? parse_hosts_list(c.hosts)
                                                    : parse_hostfile(read_list_file(c.hostfile, "--hostfile"), c.hostfile);
  return select_hosts(std::move(hosts), c.include_hosts, c.exclude_hosts);
}

std::vector<HostNode> plan_nodes(const config::LaunchConfig& c, const EnvironmentSnapshot& env) {
  for (const char* flag : {"nnodes", "node_rank", "rdzv_endpoint", "standalone"}) {
    const bool elastic_flag = c.elastic && (std::string(flag) == "nnodes" || std::string(flag) == "rdzv_endpoint");
    if (has_flag(c.launcher_args, flag) && !elastic_flag) {
      throw UsageError(ddp::str("--", flag, " and --", c.hostfile.empty() ? "hosts" : "hostfile",
                                " exclude each other: the host list gives the nodes and their ranks"));
    }
  }
  if (c.master_port == 0) throw UsageError("--master_port 0 (a free port) works on a single node only");
  const std::vector<HostSlots> hosts = read_hosts(c);
  RemoteJob job;
  job.launcher_path = this_executable();
  job.working_dir = working_directory();
  job.env = forwarded_env(c, env);
  job.passed_flags = passed_on_flags(c.launcher_args);
  // The binary as given: each host resolves it in its own PATH (Note [Start-up check]).
  job.program = c.program_args;
  const std::vector<std::string> master = flag_values(c.launcher_args, "master_addr");
  job.master_addr = master.empty() ? hosts.front().host : master.back();
  job.nnodes = static_cast<int>(hosts.size());
  job.nproc_given = c.nproc_given && has_flag(c.launcher_args, "nproc_per_node");
  job.gpus_given = has_flag(c.launcher_args, "gpus");
  if (!job.nproc_given) uniform_slot_count(hosts);
  if (c.elastic) {  // See Note [Elastic rounds]: the first host serves the rendezvous store
    job.elastic_nnodes = ddp::str(c.min_nnodes, ":", c.nnodes);
    if (!has_flag(c.launcher_args, "rdzv_endpoint")) job.rdzv_endpoint = hosts.front().host + ":29400";
    if (!has_flag(c.launcher_args, "rdzv_id")) job.rdzv_id = c.run_id;
  }
  std::vector<HostNode> nodes;
  for (size_t k = 0; k < hosts.size(); ++k) {
    const int rank = static_cast<int>(k);
    nodes.push_back(HostNode{hosts[k], rank, remote_command_line(job, hosts[k], rank, false),
                             remote_command_line(job, hosts[k], rank, true)});
  }
  return nodes;
}

// One host's --ssh_cmd process: its pipes, its output as lines, its exit.
struct HostProcess {
  const HostNode* node = nullptr;
  pid_t pid = -1;
  int stdin_fd = -1;  // our end of its stdin; closing it stops that host (Note [Stopping the hosts])
  int out_fd = -1;
  int err_fd = -1;
  process::LineSplitter out_lines;
  process::LineSplitter err_lines;
  std::deque<std::string> last_err;     // its last stderr lines (a failed check's reason)
  std::vector<std::string> summary;     // its launcher's failure summary, held back
  bool in_summary = false;
  std::optional<int> exit_code;          // 128 + N when killed by signal N
  std::optional<Clock::time_point> exited_at;

  bool done() const { return exit_code && out_fd < 0 && err_fd < 0; }
};

// Starts argv in a process group of its own (a Ctrl-C on the terminal reaches only this launcher,
// which then stops the hosts in order), stdin from a pipe (keep_stdin) or /dev/null.
void start_process(HostProcess& p, const std::vector<std::string>& argv, bool keep_stdin) {
  process::SpawnOptions options;
  options.path = argv.front();
  options.argv = argv;
  options.new_session = false;
  // This launcher SIGKILLed: the --ssh_cmd process ends too (See Note [Stopping the hosts]).
  options.death_signal = SIGTERM;
  options.stdin_from = keep_stdin ? process::SpawnOptions::Stdin::kPipe : process::SpawnOptions::Stdin::kNull;
  const process::SpawnedProcess child = process::spawn_process(options);
  p.pid = child.pid;
  p.stdin_fd = child.stdin_fd;
  p.out_fd = child.stdout_fd;
  p.err_fd = child.stderr_fd;
  ::fcntl(p.out_fd, F_SETFL, ::fcntl(p.out_fd, F_GETFL) | O_NONBLOCK);
  ::fcntl(p.err_fd, F_SETFL, ::fcntl(p.err_fd, F_GETFL) | O_NONBLOCK);
}

// The hosts' processes, polled together: output relayed (echo) or only kept, exits reaped.
class HostGroup {
 public:
  explicit HostGroup(bool echo) : echo_(echo) {}
  ~HostGroup() {
    for (HostProcess& p : procs_) {
      close_fd(p.stdin_fd);
      close_fd(p.out_fd);
      close_fd(p.err_fd);
      if (!p.exit_code && p.pid > 0) ::kill(-p.pid, SIGKILL);
    }
    // SIGKILLed: reaped at once, unless stuck in the kernel (bounded: kDrainS, then left to init).
    const auto deadline = after_seconds(kDrainS);
    for (HostProcess& p : procs_) {
      int status = 0;
      while (!p.exit_code && p.pid > 0 && ::waitpid(p.pid, &status, WNOHANG) == 0 && Clock::now() < deadline) {
        ::usleep(10000);
      }
    }
  }
  HostGroup(const HostGroup&) = delete;
  HostGroup& operator=(const HostGroup&) = delete;

  void start(const HostNode& node, const std::string& ssh_cmd, bool check) {
    procs_.emplace_back();
    procs_.back().node = &node;
    start_process(procs_.back(), ssh_argv(ssh_cmd, node.slots.host, check ? node.check_line : node.run_line), !check);
  }

  std::vector<HostProcess>& procs() { return procs_; }
  bool all_done() const {
    return std::all_of(procs_.begin(), procs_.end(), [](const HostProcess& p) { return p.done(); });
  }
  void close_stdins() {
    for (HostProcess& p : procs_) close_fd(p.stdin_fd);
  }
  void signal_all(int sig) {
    for (HostProcess& p : procs_) {
      if (!p.exit_code) ::kill(-p.pid, sig);
    }
  }
  // Pipes still open long after their process exited: given up (kDrainS).
  void drop_stale_pipes() {
    for (HostProcess& p : procs_) {
      if (p.exited_at && Clock::now() - *p.exited_at > std::chrono::duration<double>(kDrainS)) {
        close_fd(p.out_fd);
        close_fd(p.err_fd);
      }
    }
  }

  // Waits up to timeout_ms for output, exits or a byte on signal_fd; relays output; returns the
  // processes that exited in this call, in the order they were reaped.
  std::vector<HostProcess*> step(int signal_fd, int timeout_ms) {
    std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
    std::vector<std::pair<HostProcess*, bool>> owners{{nullptr, false}};
    for (HostProcess& p : procs_) {
      if (p.out_fd >= 0) {
        fds.push_back({p.out_fd, POLLIN, 0});
        owners.emplace_back(&p, false);
      }
      if (p.err_fd >= 0) {
        fds.push_back({p.err_fd, POLLIN, 0});
        owners.emplace_back(&p, true);
      }
    }
    ::poll(fds.data(), fds.size(), timeout_ms);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) pump(*owners[i].first, owners[i].second);
    }
    std::vector<HostProcess*> exited;
    for (HostProcess& p : procs_) {
      if (p.exit_code) continue;
      int status = 0;
      if (::waitpid(p.pid, &status, WNOHANG) != p.pid) continue;
      p.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      p.exited_at = Clock::now();
      exited.push_back(&p);
    }
    drop_stale_pipes();
    return exited;
  }

 private:
  void pump(HostProcess& p, bool is_err) {
    int& fd = is_err ? p.err_fd : p.out_fd;
    process::LineSplitter& lines = is_err ? p.err_lines : p.out_lines;
    char buf[65536];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    const auto emit = [&](std::string_view line) { take_line(p, is_err, line); };
    if (n <= 0) {
      lines.flush(emit);
      close_fd(fd);
      return;
    }
    lines.feed(std::string_view(buf, static_cast<size_t>(n)), emit);
  }

  // A line of a host's output: to this console with the host in front, except its launcher's
  // failure summary (between two rules), held back for the job's one summary.
  void take_line(HostProcess& p, bool is_err, std::string_view line) {
    std::string text(line);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    if (is_err && text == agent::kSummaryRule) {
      p.in_summary = !p.in_summary;
      return;
    }
    if (is_err && p.in_summary) {
      p.summary.push_back(text);
      return;
    }
    if (is_err && !text.empty()) {
      p.last_err.push_back(text);
      if (p.last_err.size() > kLastLines) p.last_err.pop_front();
    }
    if (!echo_) return;
    const std::string out = ddp::str(p.node->slots.host, ": ", text, "\n");
    std::FILE* stream = is_err ? stderr : stdout;
    std::fwrite(out.data(), 1, out.size(), stream);
    std::fflush(stream);
  }

  bool echo_;
  std::vector<HostProcess> procs_;
};

std::string node_name(const HostNode& node) { return ddp::str(node.slots.host, " (node ", node.node_rank, ")"); }

// Why a host failed its start-up check, in one line.
std::string check_problem(const HostProcess& p) {
  std::string last = p.last_err.empty() ? "" : p.last_err.back();
  const std::string ours = "ddp_launch: error: ";
  if (last.rfind(ours, 0) == 0) last = last.substr(ours.size());
  if (!p.exit_code) return ddp::str("no answer within ", kCheckTimeoutS, " s (--ssh_cmd reached nothing?)");
  if (*p.exit_code == 255) {
    return ddp::str("--ssh_cmd failed (exit 255): ", last.empty() ? "<no message>" : last,
                    " (it must log in without a prompt)");
  }
  if (last.empty()) return ddp::str("its check exited ", *p.exit_code, " without a message");
  return ddp::str(last, " (exit ", *p.exit_code, ")");
}

// Every host's check at once (Note [Start-up check]); returns the exit code to stop with, or
// nullopt when every host passed.
std::optional<int> check_hosts(const std::vector<HostNode>& nodes, const config::LaunchConfig& c, process::SignalPipe& signals) {
  HostGroup group(false);
  for (const HostNode& node : nodes) group.start(node, c.ssh_cmd, true);
  const auto deadline = after_seconds(kCheckTimeoutS);
  while (!group.all_done() && Clock::now() < deadline) {
    group.step(signals.read_fd(), 200);
    for (int sig : signals.drain()) {
      if (sig != SIGCHLD) return 128 + sig;  // ~HostGroup kills the checks
    }
  }
  int problems = 0;
  for (const HostProcess& p : group.procs()) {
    if (p.exit_code == 0) continue;
    std::fprintf(stderr, "ddp_launch: error: host %s: %s\n", node_name(*p.node).c_str(), check_problem(p).c_str());
    ++problems;
  }
  if (problems == 0) return std::nullopt;
  return kUsageExitCode;
}

// The job's one failure summary: the first failed host's own summary, then every other host.
void print_job_summary(HostGroup& group, const HostProcess* root, std::optional<int> local_signal, int nnodes) {
  std::string out = agent::kSummaryRule + "\n";
  if (root != nullptr) {
    out += ddp::str("ddp_launch: job FAILED: ", node_name(*root->node), " of ", nnodes, " failed first, exit code ",
                    *root->exit_code, "\n");
    if (!root->summary.empty()) {
      for (const std::string& line : root->summary) out += line + "\n";
    } else if (!root->last_err.empty()) {
      out += ddp::str("  last words: ", root->last_err.back(), "\n");
    }
  } else {
    out += ddp::str("ddp_launch: stopped by ", process::signal_name(local_signal.value_or(0)), "; every host was stopped\n");
  }
  out += "Hosts:\n";
  for (const HostProcess& p : group.procs()) {
    const std::string how = !p.exit_code ? "<still running: its --ssh_cmd process did not end>"
                                         : ddp::str("exit code ", *p.exit_code,
                                                    &p == root ? " (root cause)" : "",
                                                    &p != root && *p.exit_code != 0 && root ? " (stopped after it)" : "");
    out += ddp::str("  ", node_name(*p.node), ": ", how, "\n");
  }
  out += agent::kSummaryRule + "\n";
  std::fputs(out.c_str(), stderr);
}

// Note [Root cause across hosts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The first host whose ssh ends with a failure is not always the one that failed first: a rank
// dies on host A, its peers on host B fail at once on the closed connections, and B's launcher may
// finish (or its ssh report back) before A's, which is still giving its other workers their
// --shutdown_grace. Each host's own summary names the time of its first failure (Note [Root cause]
// in failure_report.cpp), so the root cause is the failed host with the earliest such time (the
// hosts' clocks agree to far better than a connection timeout on a cluster with NTP); hosts without
// one (ssh itself failed, a launcher error) come after every host with one, and among them the
// first whose ssh ended wins, as it does when no summary gives a time. The choice is the workers'
// rule (earliest_failure in launcher/agent/failure_report.h), fed with the hosts' times. A host
// whose summary says it was stopped from another host (the job channel told it first) failed
// after that stop, as a worker failing after its launcher's SIGTERM does: the summaries' times
// are milliseconds, and the stopped host's SIGTERMed workers can share the root host's millisecond.
std::optional<std::chrono::system_clock::time_point> failure_time(const HostProcess& p) {
  static const std::string kTimeField = "  time      : ";
  for (const std::string& line : p.summary) {
    if (line.rfind(kTimeField, 0) == 0) return agent::parse_failure_time(line.substr(kTimeField.size()));
  }
  return std::nullopt;
}

bool stopped_from_another_host(const HostProcess& p) {
  return std::any_of(p.summary.begin(), p.summary.end(),
                     [](const std::string& line) { return line.rfind(agent::kStoppedFromAnotherHost, 0) == 0; });
}

// The hosts in the workers' rule (earliest_failure): those whose summary gives a time come first
// (pass 0) and the earliest of them wins; without any, the first to fail (the lowest tie).
const HostProcess* root_cause(HostGroup& group, const HostProcess* first_failed) {
  std::vector<const HostProcess*> failed;
  std::vector<agent::FailureOrder> order;
  for (const HostProcess& p : group.procs()) {
    if (!p.exit_code || *p.exit_code == 0) continue;
    const auto time = failure_time(p);
    failed.push_back(&p);
    order.push_back({stopped_from_another_host(p), time ? 0 : 1, time,
                     &p == first_failed ? 0 : static_cast<int>(failed.size())});
  }
  return failed.empty() ? first_failed : failed[agent::earliest_failure(order)];
}

// Note [Stopping the hosts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Each host's ddp_launch runs with --watch_stdin, its stdin being ssh's channel whose local end is
// a pipe only this launcher holds (close-on-exec, so no other child inherits it). To stop a host,
// this launcher closes its end: ssh sends EOF, the remote launcher's stdin closes and it stops its
// workers as on SIGTERM (--shutdown_grace, then SIGKILL), prints its summary and exits; ssh
// exits with its code. The same EOF arrives without this launcher's help when it is SIGKILLed (the
// kernel closes its pipe ends) and when an ssh process dies (sshd closes the session's channel),
// so no path leaves workers behind. Each --ssh_cmd process also gets SIGTERM when this launcher dies
// (PR_SET_PDEATHSIG): for an ssh_cmd that does not pass stdin on (pdsh), that ending is what
// closes the connection. A connection that silently goes away (a cable pulled) is seen
// by sshd only through TCP or ssh keep-alives (ClientAliveInterval, ServerAliveInterval).
// The first host to fail is stopped at once (its collectives would fail anyway, later and with a
// less useful message), and the job's exit code is the root cause's (See Note [Root cause across
// hosts]). The ssh processes run in process groups of their own, so a Ctrl-C on the terminal
// reaches this launcher only, which stops the hosts in this order rather than cutting their ssh.
int supervise_hosts(const std::vector<HostNode>& nodes, const config::LaunchConfig& c, process::SignalPipe& signals) {
  HostGroup group(true);
  for (const HostNode& node : nodes) group.start(node, c.ssh_cmd, false);
  const HostProcess* root = nullptr;
  bool any_succeeded = false;  // elastic: a host finished the job
  std::optional<int> local_signal;
  // Stopping: stdin closed, then SIGTERM, then SIGKILL to the --ssh_cmd processes still there.
  std::optional<Clock::time_point> next_at;
  int stage = 0;
  const auto begin_stop = [&] {
    if (next_at) return;
    group.close_stdins();
    next_at = after_seconds(c.shutdown_grace_s + kStopSlackS);
  };
  while (!group.all_done()) {
    for (HostProcess* p : group.step(signals.read_fd(), 200)) {
      if (c.elastic && !next_at) {  // See Note [Elastic rounds]: the others go on without it
        if (*p->exit_code != 0) {
          spdlog::warn("{} exited with {}: the elastic job goes on without it (not restarted; start it again by "
                       "hand to join)", node_name(*p->node), *p->exit_code);
          if (root == nullptr) root = p;
        } else {
          any_succeeded = true;
        }
        continue;
      }
      if (*p->exit_code != 0 && root == nullptr && !next_at) {
        root = p;
        spdlog::error("{} exited with {}: stopping the other hosts", node_name(*p->node), *p->exit_code);
      }
      if (*p->exit_code != 0) begin_stop();
    }
    for (int sig : signals.drain()) {
      if (sig == SIGCHLD || local_signal) continue;
      local_signal = sig;
      spdlog::warn("received {}: stopping every host", process::signal_name(sig));
      begin_stop();
    }
    if (next_at && Clock::now() >= *next_at) {
      if (stage == 2) break;  // SIGKILLed kDrainS ago: what is still open is given up
      spdlog::error("hosts still running {} s after being told to stop: {} to their --ssh_cmd processes",
                    c.shutdown_grace_s + (stage + 1) * kStopSlackS, stage == 0 ? "SIGTERM" : "SIGKILL");
      group.signal_all(stage == 0 ? SIGTERM : SIGKILL);
      next_at = after_seconds(stage == 0 ? kStopSlackS : kDrainS);
      ++stage;
    }
  }
  int code = 0;
  if (local_signal) {
    code = 128 + *local_signal;
  } else if (root != nullptr && !(c.elastic && any_succeeded)) {  // else the job finished on the hosts that remained
    root = root_cause(group, root);
    code = *root->exit_code;
  }
  if (code != 0) print_job_summary(group, local_signal ? nullptr : root, local_signal, static_cast<int>(nodes.size()));
  return code;
}

}  // namespace

bool starts_every_host(const config::LaunchConfig& c) {
  const bool on_hosts = !c.hostfile.empty() || !c.hosts.empty();
  if (!on_hosts) {
    for (const char* flag : {"include", "exclude", "env"}) {
      if (has_flag(c.launcher_args, flag)) {
        throw UsageError(ddp::str("--", flag, " works with --hostfile or --hosts, which are not given"));
      }
    }
  }
  return on_hosts;
}

int launch_on_hosts(const config::LaunchConfig& c, const EnvironmentSnapshot& env) {
  const std::vector<HostNode> nodes = plan_nodes(c, env);
  if (c.dry_run) {
    std::printf("ddp_launch dry run: %zu hosts, master %s; nothing is started\n", nodes.size(),
                flag_values(c.launcher_args, "master_addr").empty() ? nodes.front().slots.host.c_str()
                                                                     : flag_values(c.launcher_args, "master_addr").back().c_str());
    for (const HostNode& node : nodes) {
      std::printf("%s: %s %s %s\n", node_name(node).c_str(), c.ssh_cmd.c_str(), node.slots.host.c_str(),
                  quote_for_shell(node.run_line).c_str());
    }
    return 0;
  }
  process::SignalPipe signals({SIGINT, SIGTERM, SIGHUP});
  std::vector<std::string> names;
  for (const HostNode& node : nodes) names.push_back(node.slots.host);
  spdlog::info("checking {} hosts over '{}': {}", nodes.size(), c.ssh_cmd, ddp::join(names, ", "));
  if (const auto stop = check_hosts(nodes, c, signals)) return *stop;
  spdlog::info("starting {} nodes: {}", nodes.size(), ddp::join(names, ", "));
  return supervise_hosts(nodes, c, signals);
}

void stop_when_stdin_closes() {
  std::thread([] {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(0, buf, sizeof buf);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      break;
    }
    ::kill(::getpid(), SIGTERM);
  }).detach();
}

}  // namespace ddp::launcher::hosts
