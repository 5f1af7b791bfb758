// Start-to-exit time of ddp_launch vs torchrun starting the same workers (figures, not a test).
//   build/bin/launch_startup_bench [--reps 10] [--nproc 8] [--torchrun .venv/bin/torchrun] [--worker /bin/true]
// Runs alternate (ddp_launch, torchrun, ddp_launch, ...) so that machine noise hits both alike; each
// launcher gets its own free --master_port. Prints every run, the medians and their ratio.
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

#include "launcher/net.h"

extern char** environ;

namespace {

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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  int nproc = 8;
  std::string launcher = DDP_BENCH_LAUNCHER;
  std::string torchrun = DDP_BENCH_SOURCE_DIR "/.venv/bin/torchrun";
  std::string worker = "/bin/true";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else if (flag == "--nproc") nproc = std::atoi(argv[i + 1]);
    else if (flag == "--torchrun") torchrun = argv[i + 1];
    else if (flag == "--launcher") launcher = argv[i + 1];
    else if (flag == "--worker") worker = argv[i + 1];
    else {
      std::fprintf(stderr, "launch_startup_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (reps < 1 || nproc < 1) {
    std::fprintf(stderr, "launch_startup_bench: --reps and --nproc must be >= 1\n");
    return 2;
  }
  if (::access(torchrun.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "launch_startup_bench: no torchrun at %s (give --torchrun PATH)\n", torchrun.c_str());
    return 2;
  }
  const std::string n = std::to_string(nproc);
  auto ours = [&] {
    return std::vector<std::string>{launcher, "--nproc_per_node", n, "--master_port", std::to_string(ddp::launcher::pick_free_port("127.0.0.1")), worker};
  };
  auto theirs = [&] {
    return std::vector<std::string>{torchrun, "--no-python", "--nproc_per_node", n, "--master_port",
                                    std::to_string(ddp::launcher::pick_free_port("127.0.0.1")), worker};
  };
  std::printf("start-to-exit of %d workers of %s, %d alternating runs each (after one warm-up run each)\n", nproc,
              worker.c_str(), reps);
  std::printf("  A: %s --nproc_per_node %d --master_port <free> %s\n", launcher.c_str(), nproc, worker.c_str());
  std::printf("  B: %s --no-python --nproc_per_node %d --master_port <free> %s\n", torchrun.c_str(), nproc,
              worker.c_str());
  if (time_run(ours()) < 0 || time_run(theirs()) < 0) {
    std::fprintf(stderr, "launch_startup_bench: a warm-up run failed\n");
    return 1;
  }
  std::vector<double> a, b;
  for (int r = 0; r < reps; ++r) {
    const double ta = time_run(ours());
    const double tb = time_run(theirs());
    if (ta < 0 || tb < 0) {
      std::fprintf(stderr, "launch_startup_bench: run %d failed\n", r);
      return 1;
    }
    a.push_back(ta);
    b.push_back(tb);
    std::printf("  run %2d: ddp_launch %8.1f ms   torchrun %8.1f ms\n", r, ta * 1e3, tb * 1e3);
  }
  const double ma = median(a), mb = median(b);
  std::printf("median: ddp_launch %.1f ms (min %.1f), torchrun %.1f ms (min %.1f)\n", ma * 1e3,
              *std::min_element(a.begin(), a.end()) * 1e3, mb * 1e3, *std::min_element(b.begin(), b.end()) * 1e3);
  std::printf("ratio: ddp_launch takes 1/%.0f of torchrun's time (target: at most 1/20)\n", mb / ma);
  return 0;
}
