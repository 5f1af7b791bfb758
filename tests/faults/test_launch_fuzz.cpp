// Fuzz test of ddp_launch's command line (issue 6, bad input): at least 1000 random and malformed
// argument vectors built from a seeded PRNG (real flag names in both spellings, values, numbers out
// of range, garbage bytes, empty strings, '=' forms, duplicates). Most runs use --dry_run; the
// others only start /bin/true or /bin/false with a small worker count. Every run must end within
// its timeout, never by a signal, with 0 or 2 (and a "ddp_launch: error:" line on stderr for 2), or
// with the binary's own code (PATH holds only true and false). The seed is printed; DDP_FUZZ_SEED=<seed> replays a run.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "tests/launcher/process_harness.h"

using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kFlags = {
    "nnodes", "node_rank", "nproc_per_node", "master_addr", "master_port", "standalone", "rdzv_endpoint",
    "rdzv_id", "rdzv_backend", "rdzv_timeout", "max_restarts", "monitor_interval", "shutdown_grace", "log_dir",
    "redirects", "tee", "local_ranks_filter", "ranks_filter", "log_line_prefix_template", "collapse_lines", "gpus",
    "allow_busy_gpus", "dry_run", "no_python", "run_id",
    "hang_timeout", "metrics_port", "metrics_addr", "straggler_action", "straggler_factor", "straggler_window", "help", "version", "print_completion",
    // torchrun's flags (docs/launcher.md, "torchrun's flags"), refused ones included.
    "rdzv_conf", "local_addr", "role", "shutdown_timeout", "signals_to_handle", "start_method", "event_log_handler",
    "module", "run_path", "logs_specs", "numa_binding", "virtual_local_rank", "duplicate_stdout_filters",
    "duplicate_stderr_filters"};

// Values that mean something to some flag, and values that mean nothing to any.
const std::vector<std::string> kValues = {
    "0", "1", "2", "3", "-1", "-0", "+1", "007", "1.5", "0.001", "1e3", "1e309", "-1e-9", "nan", "inf", "-inf",
    "0x10", "2147483647", "2147483648", "-2147483649", "65537", "1048577", "99999999999999999999999",
    "1:1", "2:2", "1:3", ":", "1:", ":1", "gpu", "cpu", "auto", "auto:2", "auto:0", "auto:x", "0,1", "0,0", "1,",
    ",", "0:1,1:2", "0:4", "3", "127.0.0.1", "localhost", "::1", "127.0.0.1:0", "127.0.0.1:70000", "host:",
    ":29400", "[::1]:29400", "c10d", "static", "etcd", "job/1", "a b", "", " ", "=", "==", "--", "-", "none",
    "logs", "./logs/x", "/nonexistent/dir", "/dev/null", "\t", "\xff\xfe", "\xc3\xa9t\xc3\xa9", "%s%n", "$(true)",
    "join_timeout=5", "is_host=1", "join_timeout=", "a=b=c", "SIGTERM,SIGUSR1", "SIGKILL", "SIGTERM,,", "fork",
    "-r3", "-t=0:1", "-m", "-h", "--nproc"};

class ArgvFuzzer {
 public:
  explicit ArgvFuzzer(uint64_t seed) : rng_(seed) {}

  // One argument vector (without the launcher's path) and whether it may start real processes.
  std::vector<std::string> next(bool& real_run) {
    real_run = chance(0.12);
    std::vector<std::string> argv;
    const int n = pick(9);
    for (int i = 0; i < n; ++i) real_run ? safe_flag(argv) : any_token(argv);
    if (!real_run) argv.insert(argv.begin() + pick(static_cast<int>(argv.size()) + 1), "--dry_run");
    if (chance(0.1)) argv.push_back("--");
    argv.push_back(binary(real_run));
    for (int i = pick(4); i > 0; --i) argv.push_back(chance(0.5) ? "--" + one_of(kFlags) : value());
    return argv;
  }

 private:
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  template <typename T>
  const T& one_of(const std::vector<T>& items) { return items[static_cast<size_t>(pick(static_cast<int>(items.size())))]; }

  std::string flag_name() {
    std::string name = one_of(kFlags);
    if (chance(0.3)) {  // the other spelling, or a near miss
      for (auto& c : name) if (c == '_') c = '-';
    }
    if (chance(0.05)) name.pop_back();
    if (chance(0.03)) name += "x";
    return (chance(0.05) ? "-" : "--") + name;
  }

  std::string value() {
    if (chance(0.1)) return garbage();
    if (chance(0.1)) return std::to_string(static_cast<int64_t>(rng_()));
    return one_of(kValues);
  }

  std::string garbage() {
    std::string s;
    for (int i = pick(24); i > 0; --i) s.push_back(static_cast<char>(1 + pick(255)));  // no NUL in argv
    return s;
  }

  void any_token(std::vector<std::string>& argv) {
    const int kind = pick(10);
    if (kind < 6) {
      argv.push_back(flag_name());
      argv.push_back(value());
    } else if (kind < 8) {
      argv.push_back(flag_name() + "=" + value());
    } else if (kind < 9) {
      argv.push_back(flag_name());
    } else {
      argv.push_back(chance(0.5) ? garbage() : one_of(kValues));
    }
  }

  // Flags whose every value here is harmless when the workers really start.
  void safe_flag(std::vector<std::string>& argv) {
    static const std::vector<std::vector<std::string>> safe = {
        {"--nproc_per_node", "1", "2", "3", "0", "-1", "x", "", "cpu", "2.5"},
        {"--nproc-per-node", "1", "2", "65537"},
        {"--max_restarts", "0", "1", "2", "-1", "huge", "1e2"},
        {"--monitor_interval", "0.01", "0.05", "0", "-1", "nan", "inf", "1e-300", "x"},
        {"--shutdown_grace", "0", "1", "-1", "nan", "inf", "1e309", ""},
        {"--master_port", "0", "-1", "65536", "x"},
        {"--redirects", "0", "3", "0:1,1:2", "4", "x:1", "1:", ""},
        {"--tee", "1", "2", "3", "0:3", "9"},
        {"--local_ranks_filter", "0", "0,1", "5", "-1", ",", "x"},
        {"--ranks_filter", "0", "0,8-15", "3-1", "1-", "-", "x"},
        {"--log_line_prefix_template", "[${rank}]:", "$", "${", "$$", "${hostname}"},
        {"--collapse_lines", "0", "0.3", "-1", "x", "1e9"},
        {"--print_completion", "bash", "zsh", "tcsh", "fish", ""},
        {"--run_id", "r1", "", "a/b", "x y"},
        {"--standalone"},
        {"--no_python"},
        {"--rdzv_backend", "static", "c10d", "x"},
        {"--hang_timeout", "0", "1", "-1", "nan", "inf", "1e309", "x", ""},
        {"--metrics_port", "0", "-1", "65536", "x", ""},
        {"--metrics_addr", "127.0.0.1", "::1", "localhost", "1.2.3", ""},
        {"--straggler_action", "off", "warn", "replace", ""}};
    const auto& choice = one_of(safe);
    if (choice.size() == 1) {
      argv.push_back(choice[0]);
      return;
    }
    const std::string& v = choice[1 + static_cast<size_t>(pick(static_cast<int>(choice.size()) - 1))];
    if (chance(0.3)) {
      argv.push_back(choice[0] + "=" + v);
    } else {
      argv.push_back(choice[0]);
      argv.push_back(v);
    }
  }

  std::string binary(bool real_run) {
    static const std::vector<std::string> real = {"/bin/true", "/bin/false", "true", "false"};
    static const std::vector<std::string> odd = {"/nonexistent/train", "/tmp", "./not_executable", "", "-", "./",
                                                 "no_such_binary_xyz", "/bin/true/x"};
    if (real_run || chance(0.7)) return one_of(real);
    return chance(0.7) ? one_of(odd) : garbage();
  }

  std::mt19937_64 rng_;
};

std::string printable(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    out += " '";
    for (const unsigned char c : a) {
      if (c >= 0x20 && c < 0x7f && c != '\'') {
        out.push_back(static_cast<char>(c));
      } else {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    }
    out += "'";
  }
  return out;
}

}  // namespace

TEST_CASE("ddp_launch: 1000+ random and malformed command lines end with 0 or 2, never a crash or hang",
          "[fuzz]") {
  const char* from_env = std::getenv("DDP_FUZZ_SEED");
  const uint64_t seed = from_env ? std::strtoull(from_env, nullptr, 10) : std::random_device{}();
  std::cout << "fuzz seed: " << seed << " (replay: DDP_FUZZ_SEED=" << seed << ")" << std::endl;
  INFO("seed " << seed);
  // Relative --log_dir values and the like land in a scratch folder. PATH holds only true and false:
  // a short garbage token that becomes the training binary must not find '[', 'yes' or 'rm'.
  TempDir scratch;
  const std::string bin = scratch.path() + "/bin";
  REQUIRE(::mkdir(bin.c_str(), 0700) == 0);
  REQUIRE(::symlink("/bin/true", (bin + "/true").c_str()) == 0);
  REQUIRE(::symlink("/bin/false", (bin + "/false").c_str()) == 0);
  // A file that is not executable (the fuzzer's ./not_executable); /etc/hostname was one until a
  // machine had it mode 755: execve then fails with ENOEXEC and the launcher reports exit 127.
  std::ofstream(scratch.path() + "/not_executable") << "not a program\n";
  // TMPDIR: the log folders that --redirects/--tee without --log_dir keep for the user land there too.
  const std::map<std::string, std::string> env{{"PATH", bin}, {"TMPDIR", scratch.path()}};
  char previous[4096];
  REQUIRE(::getcwd(previous, sizeof previous) != nullptr);
  REQUIRE(::chdir(scratch.path().c_str()) == 0);

  ArgvFuzzer fuzzer(seed);
  constexpr int kRuns = 1100;
  int exit0 = 0, exit2 = 0, binary_code = 0, real_runs = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i) {
    bool real_run = false;
    std::vector<std::string> argv = fuzzer.next(real_run);
    real_runs += real_run;
    argv.insert(argv.begin(), launcher_path());
    Child child(argv, env);
    const auto outcome = child.wait(10s);
    INFO("run " << i << ":" << printable(argv));
    REQUIRE(outcome);  // no hang
    INFO("exit " << outcome->exit_code << ", stderr: " << outcome->err);
    REQUIRE(outcome->exit_code < 128);  // no crash (a signal)
    if (outcome->exit_code == 2) {
      REQUIRE(outcome->err.find("ddp_launch: error: ") != std::string::npos);
      ++exit2;
    } else if (outcome->exit_code == 0) {
      ++exit0;
    } else {
      // Only a worker's own code: /bin/false (1) as the training binary.
      REQUIRE(outcome->exit_code == 1);
      REQUIRE(outcome->err.find("worker group FAILED") != std::string::npos);
      ++binary_code;
    }
  }
  REQUIRE(::chdir(previous) == 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << kRuns << " runs (" << real_runs << " started /bin/true or /bin/false) in " << seconds
            << " s: exit 0: " << exit0 << ", exit 2: " << exit2 << ", the binary's code: " << binary_code
            << std::endl;
}
