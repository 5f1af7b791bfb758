// A tiny worker for the launcher's process tests (no LibTorch). Actions, applied in this order:
//   --out DIR               write DIR/rank<RANK>.attempt<TORCHELASTIC_RESTART_COUNT> with "pid=", "argv=" and
//                           "env:KEY=VALUE" lines (atomically: the file appears complete)
//   --ignore-sigterm        ignore SIGTERM
//   --mark-sigterm          on SIGTERM write DIR/sigterm<RANK>, then exit 0
//   --print TEXT / --eprint TEXT / --print-partial TEXT   write to stdout / stderr / stdout without '\n'
//   --print-ranked TEXT     write "TEXT <RANK>" to stdout (after the --print lines)
//   --error-message R:MSG   rank R writes MSG into TORCHELASTIC_ERROR_FILE (torchrun's format)
//   --sleep R:SECONDS       rank R sleeps ("*" for every rank)
//   --steps R:N             rank R sends heartbeats for steps 1..N through DDP_AGENT_SOCKET, 50 ms apart
//                           (8 samples and a loss each), as DDP and ProgressReporter do
//   --hang-at R:STEP        rank R stops its heartbeats before STEP and sleeps 600 s
//   --signal R:SIG          rank R kills itself with signal SIG
//   --exit R:CODE           rank R exits with CODE
//   --fail-attempts N       --exit/--signal/--error-message/--hang-at only while TORCHELASTIC_RESTART_COUNT < N
// Unknown arguments are ignored (so tests can check that argv arrives verbatim).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/runtime/agent_channel.h"
#include "ddp/base/worker_variable_names.h"
#include "ddp/base/detail/error_file.h"
#include "ddp/base/detail/files.h"

extern char** environ;

namespace {

std::string g_out_dir;
int g_rank = -1;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// "R:VALUE" applies to this rank when R is our rank or "*".
bool for_me(const std::string& spec, std::string& value) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos) return false;
  const std::string who = spec.substr(0, colon);
  value = spec.substr(colon + 1);
  return who == "*" || who == std::to_string(g_rank);
}

void on_sigterm(int) {
  const std::string path = g_out_dir + "/sigterm" + std::to_string(g_rank);
  FILE* f = std::fopen(path.c_str(), "w");
  if (f != nullptr) std::fclose(f);
  _exit(0);
}

void sleep_seconds(double s) {
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - static_cast<long>(s)) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  g_rank = std::atoi(env_or(ddp::env::kRank, "-1").c_str());
  const int restart = std::atoi(env_or(ddp::env::kRestartCount, "0").c_str());
  std::vector<std::string> args(argv + 1, argv + argc);
  auto value_of = [&](const std::string& flag) {
    std::vector<std::string> values;
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == flag) values.push_back(args[i + 1]);
    }
    return values;
  };
  auto has = [&](const std::string& flag) {
    for (const auto& a : args) {
      if (a == flag) return true;
    }
    return false;
  };
  int fail_attempts = 1 << 30;
  for (const auto& v : value_of("--fail-attempts")) fail_attempts = std::atoi(v.c_str());
  const bool may_fail = restart < fail_attempts;

  for (const auto& dir : value_of("--out")) g_out_dir = dir;
  if (has("--ignore-sigterm")) signal(SIGTERM, SIG_IGN);
  if (has("--mark-sigterm")) signal(SIGTERM, on_sigterm);
  for (const auto& dir : value_of("--out")) {
    std::ostringstream out;
    out << "pid=" << getpid() << "\n";
    for (int i = 0; i < argc; ++i) out << "argv=" << argv[i] << "\n";
    for (char** e = environ; *e != nullptr; ++e) out << "env:" << *e << "\n";
    ddp::detail::write_file_atomically(dir + "/rank" + std::to_string(g_rank) + ".attempt" + std::to_string(restart), out.str());
  }
  for (const auto& t : value_of("--print")) std::printf("%s\n", t.c_str());
  for (const auto& t : value_of("--eprint")) std::fprintf(stderr, "%s\n", t.c_str());
  for (const auto& t : value_of("--print-ranked")) std::printf("%s %d\n", t.c_str(), g_rank);
  for (const auto& t : value_of("--print-partial")) std::printf("%s", t.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::string v;
  if (may_fail) {
    for (const auto& spec : value_of("--error-message")) {
      if (for_me(spec, v)) {
        ddp::detail::WorkerError error;
        error.message = v;
        error.timestamp = static_cast<long long>(std::time(nullptr));
        if (const std::string path = env_or(ddp::env::kErrorFile, ""); !path.empty()) ddp::detail::write_error_file(path, error);
      }
    }
  }
  for (const auto& spec : value_of("--sleep")) {
    if (for_me(spec, v)) sleep_seconds(std::atof(v.c_str()));
  }
  for (const auto& spec : value_of("--steps")) {
    if (!for_me(spec, v)) continue;
    long long hang_at = -1;
    std::string at;
    for (const auto& hang : value_of("--hang-at")) {
      if (may_fail && for_me(hang, at)) hang_at = std::atoll(at.c_str());
    }
    ddp::AgentChannel channel = ddp::AgentChannel::from_environment(ddp::process_environment());
    for (long long step = 1; step <= std::atoll(v.c_str()); ++step) {
      if (step == hang_at) sleep_seconds(600);
      ddp::AgentMessage m;
      m.flags = ddp::AgentMessage::kHasStep | ddp::AgentMessage::kHasSamples | ddp::AgentMessage::kHasLoss;
      m.rank = g_rank;
      m.pid = static_cast<std::int32_t>(getpid());
      m.step = step;
      m.samples = 8 * step;
      m.step_time_s = 0.05;
      m.loss = 1.0 / static_cast<double>(step);
      m.timestamp_s = static_cast<double>(std::time(nullptr));
      channel.send(m);
      sleep_seconds(0.05);
    }
  }
  if (may_fail) {
    for (const auto& spec : value_of("--signal")) {
      if (for_me(spec, v)) {
        signal(std::atoi(v.c_str()), SIG_DFL);
        raise(std::atoi(v.c_str()));
      }
    }
    for (const auto& spec : value_of("--exit")) {
      if (for_me(spec, v)) return std::atoi(v.c_str());
    }
  }
  return 0;
}
