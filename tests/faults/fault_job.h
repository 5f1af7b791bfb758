#pragma once
// What the fault tests share (test_faults.cpp, test_observability.cpp): a ddp_launch job of
// fault_worker, the pids it recorded, the time since the fault, the "fault-matrix:" report lines.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "tests/launcher/process_harness.h"

namespace ddp::launcher::testing {

using Clock = std::chrono::steady_clock;
using Env = std::map<std::string, std::string>;

// ddp_launch on a free port with a fast monitor, then fault_worker train with worker_args.
inline std::vector<std::string> job(const std::vector<std::string>& launcher_flags,
                                    const std::vector<std::string>& worker_args) {
  std::vector<std::string> argv{launcher_path(), "--master_port", "0", "--monitor_interval", "0.05"};
  argv.insert(argv.end(), launcher_flags.begin(), launcher_flags.end());
  argv.push_back(worker_path());
  argv.push_back("train");
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

inline Env fault(const std::string& spec) { return {{"DDP_FAULT", spec}}; }

// fault(spec) with TMPDIR=tmp: when a peer's failure makes the other ranks write their
// collectives-rank<R>.json next to their error files, the launcher keeps its temporary folder for
// the user; in a test it must land in the test's TempDir.
inline Env fault_in(const std::string& spec, const std::string& tmp) { return {{"DDP_FAULT", spec}, {"TMPDIR", tmp}}; }

// The pids fault_worker recorded in dir (rank<R>.attempt<A>.pid).
inline std::vector<int> recorded_pids(const std::string& dir) {
  std::vector<int> pids;
  for (const auto& name : list_dir(dir)) {
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".pid") == 0) pids.push_back(std::stoi(read_text(dir + "/" + name)));
  }
  return pids;
}

// Every recorded worker is gone (not even a zombie), checked in /proc right after the launcher exited.
inline void require_gone(const std::vector<int>& pids) {
  const auto alive = wait_gone(pids, std::chrono::seconds(2));
  INFO("still alive: " << Catch::Detail::stringify(alive));
  REQUIRE(alive.empty());
}

// Seconds from the fault (fault.at, written by the faulty rank) to `end`.
inline double seconds_since_fault(const std::string& dir, Clock::time_point end) {
  const std::string text = read_text(dir + "/fault.at");
  REQUIRE_FALSE(text.empty());
  const Clock::time_point at{Clock::duration{std::stoll(text)}};
  return std::chrono::duration<double>(end - at).count();
}

inline void report(const std::string& fault, const std::string& what) {
  std::cout << "fault-matrix: " << fault << ": " << what << std::endl;
}

inline std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

}  // namespace ddp::launcher::testing
