// Start-to-exit time of ddp_launch vs torchrun starting the same workers (figures, not a test).
//   build/bin/launch_startup_bench [--reps 10] [--warmup 1] [--nproc 8] [--torchrun .venv/bin/torchrun]
//                                  [--worker /bin/true] [--csv F] [--json F]
// Runs alternate (ddp_launch, torchrun, ddp_launch, ...) so that machine noise hits both alike; each
// launcher gets its own free --master_port. Prints every run and the harness's table (medians,
// minima, a correctness column: every run exited 0) with the ratio. Free of LibTorch: it links the
// launcher's core and the torch-free harness (benchmarks/harness.h).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/harness.h"
#include "launcher/process/net.h"

extern char** environ;

namespace {

using namespace ddp::bench;

// Runs argv with stdout/stderr to /dev/null; returns seconds, or a negative value on failure.
double time_run(const std::vector<std::string>& argv) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? seconds : -1;
}

struct Options {
  TimingOptions timing{1, 10};  // one warm-up run of each launcher, then --reps alternating pairs
  int nproc = 8;
  std::string launcher = DDP_BENCH_LAUNCHER;
  std::string torchrun = DDP_BENCH_SOURCE_DIR "/.venv/bin/torchrun";
  std::string worker = "/bin/true";
  OutputOptions output;
};

Options parse(int argc, char** argv) {
  CommandLine cli("launch_startup_bench", "Start-to-exit time of ddp_launch vs torchrun starting the same workers.");
  const Options d;
  cli.add_harness_flags(d.timing, "reps");
  cli.add("nproc", "workers per launch", std::to_string(d.nproc));
  cli.add("launcher", "the ddp_launch to time", d.launcher);
  cli.add("torchrun", "the torchrun to compare with", d.torchrun);
  cli.add("worker", "the program both launchers start", d.worker);
  cli.parse(argc, argv);
  Options o;
  o.timing = cli.timing();
  o.nproc = static_cast<int>(cli.integer("nproc", 1, 4096));
  o.launcher = cli.text("launcher");
  o.torchrun = cli.text("torchrun");
  o.worker = cli.text("worker");
  o.output = cli.output();
  if (::access(o.torchrun.c_str(), X_OK) != 0) throw ddp::UsageError("no torchrun at " + o.torchrun + " (give --torchrun PATH)");
  if (::access(o.launcher.c_str(), X_OK) != 0) throw ddp::UsageError("no ddp_launch at " + o.launcher + " (give --launcher PATH)");
  return o;
}

int run(const Options& o) {
  const std::string n = std::to_string(o.nproc);
  const auto port = [] { return std::to_string(ddp::launcher::process::pick_free_port("127.0.0.1")); };
  const auto ours = [&] {
    return std::vector<std::string>{o.launcher, "--nproc_per_node", n, "--master_port", port(), o.worker};
  };
  const auto theirs = [&] {
    return std::vector<std::string>{o.torchrun, "--no-python", "--nproc_per_node", n, "--master_port", port(), o.worker};
  };
  std::printf("start-to-exit of %d workers of %s, %lld alternating runs each (after %lld warm-up run(s) each)\n", o.nproc,
              o.worker.c_str(), static_cast<long long>(o.timing.iters), static_cast<long long>(o.timing.warmup));
  std::printf("  A: %s --nproc_per_node %d --master_port <free> %s\n", o.launcher.c_str(), o.nproc, o.worker.c_str());
  std::printf("  B: %s --no-python --nproc_per_node %d --master_port <free> %s\n", o.torchrun.c_str(), o.nproc,
              o.worker.c_str());
  // Alternating pairs (ddp_launch, torchrun, ...) so that machine noise hits both alike; a failed
  // run (no exit 0) marks its launcher FAIL in the correctness column.
  std::vector<double> a, b;
  bool a_ok = true, b_ok = true;
  int64_t pair = 0;
  time_iterations(o.timing, [&] {
    const double ta = time_run(ours());
    const double tb = time_run(theirs());
    a_ok = a_ok && ta >= 0;
    b_ok = b_ok && tb >= 0;
    if (pair++ < o.timing.warmup) return;
    a.push_back(ta);
    b.push_back(tb);
    std::printf("  run %2zu: ddp_launch %8.1f ms   torchrun %8.1f ms\n", a.size() - 1, ta * 1e3, tb * 1e3);
  });
  Table table({"launcher", "nproc", "runs", "median_ms", "min_ms", "mean_ms", "stddev_ms", "correct"});
  const auto row = [&](const char* name, const std::vector<double>& seconds, bool ok) {
    const Summary s = summarize(seconds);
    table.add_row();
    table.set("launcher", name);
    table.set("nproc", n);
    table.set("runs", std::to_string(s.count));
    table.set("median_ms", s.median * 1e3, 1);
    table.set("min_ms", s.min * 1e3, 1);
    table.set("mean_ms", s.mean * 1e3, 1);
    table.set("stddev_ms", s.stddev * 1e3, 1);
    table.set("correct", ok ? "OK" : "FAIL");
    return s.median;
  };
  const double ma = row("ddp_launch", a, a_ok), mb = row("torchrun", b, b_ok);
  const std::string ratio = a_ok && b_ok && ma > 0 ? fixed(mb / ma, 0) : "n/a";
  emit(table, o.output, {{"benchmark", "launch_startup_bench"}, {"worker", o.worker}, {"ratio", ratio}},
       {"ratio: ddp_launch takes 1/" + ratio + " of torchrun's time (target: at most 1/20)"});
  if (!a_ok || !b_ok) {
    std::fprintf(stderr, "launch_startup_bench: a run did not exit 0 (correct column)\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return with_usage("launch_startup_bench", [&] { return run(parse(argc, argv)); });
}
