// ddp_launch: starts the workers of one node of a data-parallel job. See docs/launcher.md.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/detail/report_files.h"
#include "launcher/agent/agent.h"
#include "launcher/config/config.h"
#include "launcher/resources/gpu_select.h"
#include "launcher/process/log_layout.h"
#include "launcher/process/net.h"
#include "launcher/process/spawn.h"
#include "launcher/hosts/remote_command.h"
#include "launcher/hosts/remote_launch.h"
#include "launcher/agent/plan.h"
#include "launcher/resources/resources.h"

#ifndef DDP_LAUNCH_VERSION
#define DDP_LAUNCH_VERSION "unknown"
#endif

namespace ddp::launcher {
namespace {

// Whether a worker wrote its last collectives (ddp library, collectives-rank<R>.json) below dir:
// without --log_dir they go next to the error file, in the temporary folder, which is then kept.
bool has_collective_logs(const std::string& dir) {
  std::error_code error;
  for (std::filesystem::recursive_directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (ddp::detail::is_collectives_file_name(it->path().filename().string())) return true;
  }
  return false;
}

// --dry_run: the plan of attempt 0, printed; nothing is started or created.
void print_dry_run(const config::LaunchConfig& c, const rendezvous::NodeAssignment& node, const agent::LocalWorkers& local,
                   const agent::RunContext& run, bool dynamic) {
  // An elastic job's size is the round's (See Note [Elastic rounds]).
  const std::string nodes = c.elastic ? ddp::str(c.min_nnodes, " to ", c.nnodes, " (elastic)") : std::to_string(c.nnodes);
  const std::string world = c.elastic ? ddp::str(c.min_nnodes * local.nproc, " to ", c.nnodes * local.nproc)
                                      : std::to_string(c.nnodes * local.nproc);
  std::printf("ddp_launch dry run: %d workers on node %s of %s, world size %s, master %s:%s, run id %s; "
              "nothing is started\n",
              local.nproc, dynamic ? "<assigned at rendezvous>" : std::to_string(node.node_rank).c_str(), nodes.c_str(),
              world.c_str(), dynamic ? "<rank 0 node>" : node.master_addr.c_str(),
              dynamic || c.master_port == 0 ? "<free port>" : std::to_string(c.master_port).c_str(),
              c.run_id.c_str());
  // Everything else the flags decided, so that two command lines with the same meaning print the
  // same dry run (tests compare torchrun's spellings with ddp_launch's).
  std::vector<std::string> signals;
  for (int sig : c.forwarded_signals) signals.push_back(process::signal_name(sig));
  std::printf("supervision: max_restarts %d, monitor_interval %g s, shutdown_grace %g s, forwarded signals %s; "
              "rendezvous %s, timeout %g s%s; log_dir %s\n",
              c.max_restarts, c.monitor_interval_s, c.shutdown_grace_s, ddp::join(signals, ",").c_str(),
              c.rdzv_host.empty() ? "static" : ddp::str(c.rdzv_host, ":", c.rdzv_port).c_str(), c.rdzv_timeout_s,
              c.local_addr.empty() ? "" : (", local_addr " + c.local_addr).c_str(),
              c.log_dir.empty() ? "none" : c.log_dir.c_str());
  const auto route = [](bool console, const std::string& file) {
    return std::string(console ? (file.empty() ? "console" : "console and file") : (file.empty() ? "nowhere" : "file"));
  };
  std::string cmd;
  for (const auto& a : c.program_args) cmd += (cmd.empty() ? "" : " ") + hosts::quote_for_shell(a);
  for (const process::WorkerLaunch& w : agent::plan_workers(c, node, local, run, 0)) {
    const std::string& prefix = w.console_prefix;
    std::printf("%scommand: %s (executable: %s)\n", prefix.c_str(), cmd.c_str(), c.program_path.c_str());
    std::string vars;
    for (const auto& [k, v] : w.launcher_set) {
      const bool free_port = k == ddp::env::kMasterPort && v == "0";  // chosen at start (Note [Free port on one node])
      vars += " " + k + "=" + (free_port ? std::string("<free port>") : hosts::quote_for_shell(v));
    }
    std::printf("%senv:%s (plus the launcher's environment)\n", prefix.c_str(), vars.c_str());
    if (!w.cpus.empty()) std::printf("%scpus: %s\n", prefix.c_str(), resources::format_cpu_list(w.cpus).c_str());
    std::printf("%soutput: stdout to %s, stderr to %s%s%s\n", prefix.c_str(),
                route(w.stdout_to_console, w.stdout_log).c_str(), route(w.stderr_to_console, w.stderr_log).c_str(),
                w.filtered_stdout_log.empty() ? "" : ("; stdout lines containing " + ddp::join(c.duplicate_stdout_filters, " or ") + " also to filtered_stdout.log").c_str(),
                w.filtered_stderr_log.empty() ? "" : ("; stderr lines containing " + ddp::join(c.duplicate_stderr_filters, " or ") + " also to filtered_stderr.log").c_str());
  }
}

// The run's folder (See Note [Log folders]): below --log_dir, else a temporary one in TMPDIR that is
// removed at the end unless it holds something the user needs (logs, collective diagnostics).
class RunFolder {
 public:
  RunFolder(const config::LaunchConfig& c, const EnvironmentSnapshot& env) : temporary_(c.log_dir.empty()) {
    if (temporary_) {
      std::string tmp = env.get("TMPDIR").value_or("");
      if (tmp.empty()) tmp = "/tmp";
      path_ = process::create_run_folder(tmp, "ddp_launch_" + c.run_id + "_", "the temporary folder (TMPDIR)");
    } else {
      path_ = process::create_run_folder(c.log_dir, c.run_id + "_", "--log_dir");
      spdlog::info("logs of this run: {}", path_);
    }
  }
  ~RunFolder() {
    if (!temporary_) {
      ::rmdir(path_.c_str());  // only when empty: nothing started (a failed rendezvous, say)
      return;
    }
    if (keep_ || has_collective_logs(path_)) {
      spdlog::info("worker logs are in {}", path_);
    } else {
      std::error_code ignored;
      std::filesystem::remove_all(path_, ignored);
    }
  }
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;
  const std::string& path() const { return path_; }
  // The temporary folder holds log files the user asked for (--redirects/--tee): keep it.
  void keep() { keep_ = true; }

 private:
  bool temporary_;
  bool keep_ = false;
  std::string path_;
};

// The launcher on one node: its workers planned, then the agent (See Note [One node agent]).
int run(const config::LaunchConfig& c, const EnvironmentSnapshot& env) {
  resources::MachineResources machine = resources::MachineResources::of_this_machine();
  agent::LocalWorkers local;
  local.nproc = resources::resolve_nproc(c, env, machine);
  local.spares = c.spares;
  // A spare is placed as a worker is: a GPU and CPUs of its own (See Note [Hot spares in ddp_launch]).
  local.gpus = resources::resolve_visible_gpus(c, env, local.nproc + local.spares, machine);
  std::string binding;
  local.cpu_slices = resources::resolve_cpu_binding(c, env, local.nproc + local.spares, local.gpus, machine, binding);
  if (c.gpus.mode == config::GpuRequest::Mode::kAuto) spdlog::info("--gpus auto picked GPUs {}", ddp::join(local.gpus, ","));
  for (const auto& note : c.notes) spdlog::info("{}", note);
  for (const auto& warning : c.warnings) spdlog::warn("{}", warning);

  agent::RunContext run;
  run.inherited = env.vars;
  run.host_name = process::this_host_name();
  run.inherited.erase("DDP_RDZV_TOKEN");  // the launchers' secret (See Note [Rendezvous token]), not the workers'
  if (c.dry_run) {
    rendezvous::NodeAssignment node = rendezvous::assignment_from_flags(c, local.nproc);  // binds and probes nothing
    if (node.nnodes > 1) node.master_port = 0;  // the workers' store: a free port (See Note [One port per job])
    run.run_folder = "<per-run folder>";
    print_dry_run(c, node, local, run, !c.rdzv_host.empty());
    return 0;
  }

  if (!local.cpu_slices.empty()) {
    std::string bound;
    for (int lr = 0; lr < local.nproc; ++lr) {
      bound += ddp::str(lr == 0 ? "" : ", ", "local rank ", lr, ": ", resources::format_cpu_list(local.cpu_slices[lr]));
    }
    spdlog::info("{}: {}{}", binding, bound,
                 env.get(ddp::env::kOmpNumThreads) ? "" : " (OMP_NUM_THREADS = each worker's CPU count)");
  } else if (agent::needs_omp_default(env.vars, local.nproc)) {
    spdlog::warn("setting OMP_NUM_THREADS=1 for each of the {} workers to avoid overloading the machine; "
                 "set OMP_NUM_THREADS to tune it",
                 local.nproc);
  }
  // Made before the rendezvous: a --log_dir that cannot hold the run fails before other nodes wait.
  RunFolder folder(c, env);
  run.run_folder = folder.path();
  if (agent::writes_log_files(c, local.nproc)) folder.keep();
  return agent::run_agent(c, env, local, run);
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
    const config::ParseResult parsed = config::parse_launch_args(argc, argv, env);
    if (parsed.action == config::ParseResult::Action::kHelp ||
        parsed.action == config::ParseResult::Action::kPrintCompletion) {
      std::fputs(parsed.help_text.c_str(), stdout);
      return 0;
    }
    if (parsed.action == config::ParseResult::Action::kVersion) {
      std::printf("ddp_launch %s\n", DDP_LAUNCH_VERSION);
      return 0;
    }
    if (hosts::starts_every_host(parsed.config)) return hosts::launch_on_hosts(parsed.config, env);  // docs/launcher.md
    if (parsed.config.watch_stdin) hosts::stop_when_stdin_closes();
    return run(parsed.config, env);
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "ddp_launch: error: %s\n", e.what());
    return ddp::kUsageExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_launch: error: %s\n", e.what());
    return 1;
  }
}
