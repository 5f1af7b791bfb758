#pragma once
// In-process ranks for unit tests: one thread per rank, every rank's ddp::ProcessGroup built over one
// c10d::HashStore with ddp::new_process_group (see Note [Groups over an existing store] in
// ddp/distributed/process_group.h), as c10d's and Gloo's own tests run their ranks. The collectives are real
// Gloo ones over 127.0.0.1; no process is started.
//
// Catch2's assertions are not thread-safe: a rank's body returns what it observed and the test
// checks the results on the main thread.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"

namespace ddp::testing {

// Bound of every collective and of the backend's rendezvous: a rank that fails early makes the
// others fail after this long instead of hanging the test.
inline constexpr std::chrono::milliseconds kRankTimeout{30000};

// Runs body(group) for ranks 0..world_size-1, each on its own thread, and returns each rank's
// result (index = rank). Once every thread has ended, the failed ranks' exceptions, if any, are
// thrown as one ddp::Error naming each rank, lowest first.
// `host_of_rank` (optional) names rank r's host: several faked hosts for the topology of the
// hierarchical collectives (see Note [Host topology] in ddp/distributed/topology.h).
template <class Result>
std::vector<Result> run_ranks(int world_size, const std::function<Result(ProcessGroup&)>& body,
                              std::chrono::milliseconds timeout = kRankTimeout,
                              const std::function<std::string(int)>& host_of_rank = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(timeout);
  std::vector<Result> results(static_cast<std::size_t>(world_size));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      const auto r = static_cast<std::size_t>(rank);
      // Every rank's group is built (or failed) before any body runs: a rank whose body uses no
      // collective would otherwise destroy its group, closing its connections, while a slower rank
      // was still connecting to it, which then failed with "Connection closed by peer" in Gloo's
      // connectFullMesh (ddp.reducer's sampler case, once in a soak round beside a CPU hog).
      const auto all_built = [&] {
        const auto until = std::chrono::steady_clock::now() + timeout;
        while (store->add("ddp/test/built", 0) < world_size && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      };
      std::shared_ptr<ProcessGroup> group;
      try {
        StoreGroupOptions options;
        options.timeout = timeout;
        if (host_of_rank) options.host_identity = host_of_rank(rank);
        group = new_process_group(store, rank, world_size, options);
      } catch (...) {
        errors[r] = std::current_exception();
      }
      store->add("ddp/test/built", 1);
      if (!group) return;
      all_built();
      try {
        results[r] = body(*group);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  // Every failed rank's message: the first to fail is not always the lowest rank, and a rank whose
  // peer failed reports only "Connection closed by peer".
  std::string failures;
  for (int rank = 0; rank < world_size; ++rank) {
    if (!errors[static_cast<std::size_t>(rank)]) continue;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(rank)]);
    } catch (const std::exception& error) {
      failures += str(failures.empty() ? "" : "; ", "rank ", rank, " of ", world_size, ": ", error.what());
    }
  }
  if (!failures.empty()) throw Error(failures);
  return results;
}

// run_ranks over `hosts` faked hosts of `ranks_per_host` ranks each (rank r on host r / ranks_per_host).
template <class Result>
std::vector<Result> run_ranks_on_hosts(int hosts, int ranks_per_host,
                                       const std::function<Result(ProcessGroup&)>& body,
                                       std::chrono::milliseconds timeout = kRankTimeout) {
  return run_ranks<Result>(hosts * ranks_per_host, body, timeout,
                           [ranks_per_host](int rank) { return "host " + std::to_string(rank / ranks_per_host); });
}

// A ProcessGroup owned elsewhere (run_ranks' thread), as the shared_ptr DistributedDataParallel takes.
inline std::shared_ptr<ProcessGroup> borrow(ProcessGroup& group) {
  return std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
}

// A c10d TCPStore server on a free port of 127.0.0.1, not waiting for any client.
inline c10::intrusive_ptr<c10d::TCPStore> serve_local_store() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(30);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

}  // namespace ddp::testing
