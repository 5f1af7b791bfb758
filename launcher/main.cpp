// ddp_launch: starts the workers of one node of a data-parallel job. See docs/launcher.md.
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "ddp/base/report_files.h"
#include "launcher/agent_socket.h"
#include "launcher/config.h"
#include "launcher/gpu_select.h"
#include "launcher/line_splitter.h"
#include "launcher/log_layout.h"
#include "launcher/metrics_server.h"
#include "launcher/net.h"
#include "launcher/progress_board.h"
#include "launcher/rdzv_client.h"
#include "launcher/resources.h"
#include "launcher/supervisor.h"
#include "launcher/worker_env.h"

#ifndef DDP_LAUNCH_VERSION
#define DDP_LAUNCH_VERSION "unknown"
#endif

namespace ddp::launcher {
namespace {

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") ==
                        std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

bool shown_on_console(const LaunchConfig& c, int local_rank) {
  if (!c.local_ranks_filter) return true;
  const auto& f = *c.local_ranks_filter;
  return std::find(f.begin(), f.end(), local_rank) != f.end();
}

// Whether a worker wrote its last collectives (ddp library, collectives-rank<R>.json) below dir:
// without --log_dir they go next to the error file, in the temporary folder, which is then kept.
bool has_collective_logs(const std::string& dir) {
  std::error_code error;
  for (std::filesystem::recursive_directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (ddp::is_collectives_file_name(it->path().filename().string())) return true;
  }
  return false;
}

int run(const LaunchConfig& c, const EnvironmentSnapshot& env) {
  MachineResources machine = MachineResources::of_this_machine();
  const int nproc = resolve_nproc(c, env, machine);
  const std::vector<std::string> gpus = resolve_visible_gpus(c, nproc, machine);
  const std::vector<std::vector<int>> cpu_slices = resolve_cpu_binding(c, nproc, machine);
  if (c.gpus.mode == GpuRequest::Mode::kAuto) spdlog::info("--gpus auto picked GPUs {}", ddp::join(gpus, ","));
  for (const auto& note : c.notes) spdlog::info("{}", note);

  NodeAssignment node;
  node.nnodes = c.nnodes;
  node.nproc_per_node = nproc;
  node.run_id = c.run_id;
  node.max_restarts = c.max_restarts;
  node.master_addr = c.master_addr;
  node.master_port = c.master_port;
  node.node_rank = c.node_rank.value_or(0);
  std::unique_ptr<Rendezvous> rendezvous;
  const bool dynamic = !c.rdzv_host.empty();
  if (!dynamic) {
    if (c.master_port == 0) {
      node.master_port = pick_free_port(c.master_addr);
    } else if (node.node_rank == 0 && probe_bind(c.master_addr, c.master_port) == BindProbe::kInUse) {
      throw UsageError(ddp::str("port ", c.master_port, " on ", c.master_addr,
                                " is already in use: pick another --master_port, or 0 for a free one"));
    }
  }

  if (c.dry_run) {
    std::printf("ddp_launch dry run: %d workers on node %s of %d, world size %d, master %s:%s, run id %s; "
                "nothing is started\n",
                nproc, dynamic ? "<assigned at rendezvous>" : std::to_string(node.node_rank).c_str(), c.nnodes,
                c.nnodes * nproc, dynamic ? "<rank 0 node>" : node.master_addr.c_str(),
                dynamic ? "<free port>" : std::to_string(node.master_port).c_str(), c.run_id.c_str());
    for (int lr = 0; lr < nproc; ++lr) {
      WorkerSlot slot;
      slot.local_rank = lr;
      slot.error_file = "<per-run folder>/attempt_0/" + std::to_string(global_rank(node, lr)) + "/error.json";
      if (!gpus.empty()) slot.visible_gpu = gpus[lr];
      if (!cpu_slices.empty()) slot.cpus = cpu_slices[lr];
      std::string cmd;
      for (const auto& a : c.program_args) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
      const std::string prefix = rank_prefix(global_rank(node, lr));
      std::printf("%scommand: %s (executable: %s)\n", prefix.c_str(), cmd.c_str(), c.program_path.c_str());
      std::string vars;
      for (const auto& [k, v] : launcher_variables(node, slot)) vars += " " + k + "=" + shell_quote(v);
      if (auto omp = omp_threads_default(env.vars, nproc, slot)) vars += " OMP_NUM_THREADS=" + *omp;
      std::printf("%senv:%s (plus the launcher's environment)\n", prefix.c_str(), vars.c_str());
      if (!slot.cpus.empty()) std::printf("%scpus: %s\n", prefix.c_str(), format_cpu_list(slot.cpus).c_str());
    }
    return 0;
  }

  // Heartbeats and metrics (docs/observability.md): only when asked for, so that by default no
  // socket is opened and workers send nothing.
  std::unique_ptr<AgentSocket> agent;
  ProgressBoard board(node.node_rank, node.nnodes * nproc);  // node rank: see below, after rendezvous
  std::unique_ptr<MetricsServer> metrics;
  if (c.hang_timeout_s > 0 || c.metrics_port > 0) agent = AgentSocket::open(env.get("TMPDIR").value_or("/tmp"));
  if (c.metrics_port > 0) metrics = std::make_unique<MetricsServer>(c.metrics_addr, c.metrics_port, board);
  if (dynamic) {
    RendezvousRequest req{c.rdzv_host, c.rdzv_port, c.rdzv_id, c.nnodes, c.rdzv_timeout_s};
    spdlog::info("rendezvous '{}' at {}:{}: waiting for {} nodes (timeout {} s)", c.rdzv_id, c.rdzv_host, c.rdzv_port,
                 c.nnodes, c.rdzv_timeout_s);
    rendezvous = join_rendezvous(req);
    node.node_rank = rendezvous->outcome().node_rank;
    node.master_addr = rendezvous->outcome().master_addr;
    node.master_port = rendezvous->outcome().master_port;
    board.set_node_rank(node.node_rank);
  }

  // Per-run folder: --log_dir, or a temporary one for the error files (and redirected output).
  // Absolute, so that TORCHELASTIC_ERROR_FILE still works for a worker that changes directory.
  std::string base = c.log_dir.empty() ? std::string() : std::filesystem::absolute(c.log_dir).lexically_normal().string();
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  bool temporary = false;
  if (base.empty()) {
    std::string tmpl = env.get("TMPDIR").value_or("/tmp") + "/ddp_launch_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw ddp::IoError("cannot create a temporary folder for error files");
    base = tmpl;
    temporary = true;
  }
  bool logs_in_temporary = false;
  if (!cpu_slices.empty()) {
    std::string bound;
    for (int lr = 0; lr < nproc; ++lr) bound += ddp::str(lr == 0 ? "" : ", ", "local rank ", lr, ": ", format_cpu_list(cpu_slices[lr]));
    spdlog::info("--cpu_bind exclusive: {}{}", bound,
                 env.get("OMP_NUM_THREADS") ? "" : " (OMP_NUM_THREADS = each worker's CPU count)");
  } else if (needs_omp_default(env.vars, nproc)) {
    spdlog::warn("setting OMP_NUM_THREADS=1 for each of the {} workers to avoid overloading the machine; "
                 "set OMP_NUM_THREADS to tune it",
                 nproc);
  }
  spdlog::info("starting {} workers (ranks {}..{} of {}) on node {} of {}, master {}:{}, run id {}", nproc,
               global_rank(node, 0), global_rank(node, nproc - 1), node.nnodes * nproc, node.node_rank, node.nnodes,
               node.master_addr, node.master_port, node.run_id);

  const GroupFactory make_group = [&](int attempt) {
    std::vector<WorkerLaunch> group;
    for (int lr = 0; lr < nproc; ++lr) {
      const int rank = global_rank(node, lr);
      const WorkerFiles files = worker_files(base, c.run_id, attempt, rank);
      make_dirs(files.dir);
      WorkerSlot slot;
      slot.local_rank = lr;
      slot.restart_count = attempt;
      slot.error_file = files.error_file;
      // Diagnostics of the ddp library (collectives-rank<R>.json), side by side for every rank.
      if (!c.log_dir.empty()) slot.log_dir = attempt_dir(base, c.run_id, attempt);
      if (!gpus.empty()) slot.visible_gpu = gpus[lr];
      if (agent) slot.agent_socket = agent->path();
      if (!cpu_slices.empty()) slot.cpus = cpu_slices[lr];
      WorkerLaunch w;
      w.local_rank = lr;
      w.cpus = slot.cpus;
      w.rank = rank;
      w.env = worker_environment(env.vars, node, slot);
      w.error_file = files.error_file;
      const int redirected = c.redirects.for_local_rank(lr);
      const int teed = c.tee.for_local_rank(lr);
      const int to_file = !c.log_dir.empty() ? kStdBoth : (redirected | teed);
      const bool shown = shown_on_console(c, lr);
      w.stdout_to_console = shown && (!(redirected & kStdOut) || (teed & kStdOut));
      w.stderr_to_console = shown && (!(redirected & kStdErr) || (teed & kStdErr));
      if (to_file & kStdOut) w.stdout_log = files.stdout_log;
      if (to_file & kStdErr) w.stderr_log = files.stderr_log;
      logs_in_temporary = logs_in_temporary || (temporary && to_file != kStdNone);
      group.push_back(std::move(w));
    }
    return group;
  };

  const SupervisorOptions options = SupervisorOptions()
                                        .set_program(c.program_path, c.program_args)
                                        .set_monitor_interval(c.monitor_interval_s)
                                        .set_shutdown_grace(c.shutdown_grace_s)
                                        .set_max_restarts(c.max_restarts)
                                        .set_host_name(this_host_name())
                                        .set_progress(agent.get(), agent ? &board : nullptr)
                                        .set_hang_timeout(c.hang_timeout_s);
  const SupervisorResult result = supervise(options, make_group);
  if (result.exit_code != 0) {
    std::fputs(format_failure_summary(result, options.host_name).c_str(), stderr);
  }
  if (logs_in_temporary || (temporary && has_collective_logs(base))) {
    spdlog::info("worker logs are in {}", run_dir(base, c.run_id));
  } else if (temporary) {
    std::error_code ignored;
    std::filesystem::remove_all(base, ignored);
  }
  rendezvous.reset();
  return result.exit_code;
}

}  // namespace
}  // namespace ddp::launcher

int main(int argc, char** argv) {
  using namespace ddp::launcher;
  ::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the supervisor
  auto logger = spdlog::stderr_logger_st("ddp_launch");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [ddp_launch] [%l] %v");
  spdlog::set_default_logger(logger);
  const ddp::EnvironmentSnapshot env = ddp::EnvironmentSnapshot::from_process();
  try {
    const ParseResult parsed = parse_launch_args(argc, argv, env);
    if (parsed.action == ParseResult::Action::kHelp) {
      std::fputs(parsed.help_text.c_str(), stdout);
      return 0;
    }
    if (parsed.action == ParseResult::Action::kVersion) {
      std::printf("ddp_launch %s\n", DDP_LAUNCH_VERSION);
      return 0;
    }
    return run(parsed.config, env);
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "ddp_launch: error: %s\n", e.what());
    return ddp::kUsageExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_launch: error: %s\n", e.what());
    return 1;
  }
}
