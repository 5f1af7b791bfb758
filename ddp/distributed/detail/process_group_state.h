#pragma once
// What a ProcessGroup holds (internal: the three files that implement ProcessGroup include it).
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "ddp/distributed/detail/collective_log.h"
#include "ddp/distributed/hierarchical_collectives.h"
#include "ddp/distributed/process_group.h"

namespace ddp {

// Note [A group behind a pointer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ProcessGroup is used through std::shared_ptr and its state lives here, as DistributedDataParallel's
// does: the public header names no internal type (the ring buffer, the slicing, the hierarchy), so
// these change without a user recompiling, and the installed headers need none of ddp/*/detail/.
struct ProcessGroup::State {
  State(Info group_info, c10::intrusive_ptr<c10d::Store> group_store, c10::intrusive_ptr<c10d::Backend> group_backend)
      : info(std::move(group_info)),
        store(std::move(group_store)),
        backend(std::move(group_backend)),
        logger(Logger::for_rank(info.rank)),
        collectives(info.collective_log_size) {}

  Info info;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  Logger logger;
  int main_first_calls = 0;
  std::atomic<bool> aborted{false};
  std::mutex abort_mutex;
  std::string abort_reason;  // guarded by abort_mutex
  detail::CollectiveLog collectives;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kAuto;
  std::mutex hierarchy_mutex;
  bool hierarchy_resolved = false;
  std::string algorithm_choice;
  std::unique_ptr<HierarchicalCollectives> hierarchy;
};

// Starts a collective, turning c10d's errors into ours.
template <class Start>
c10::intrusive_ptr<c10d::Work> ProcessGroup::start_collective(std::int64_t seq, const char* what,
                                                              Start&& start) const {
  try {
    auto work = start();
    state_->collectives.attach(seq, work.get());
    return work;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    fail_collective(seq, what, state_->info.timeout, &error);
  }
}

}  // namespace ddp
