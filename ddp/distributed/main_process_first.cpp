// ProcessGroup::run_main_process_first: rank 0 runs first, the others wait for its verdict in the
// store with a bound of their own (Note [Bounded store wait]).
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ddp/base/error.h"
#include "ddp/base/detail/store_values.h"
#include "ddp/base/str.h"
#include "ddp/distributed/detail/process_group_state.h"
#include "ddp/distributed/process_group.h"

namespace ddp {
// Note [Bounded store wait]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// c10d's TCPStore::wait sends its request, then blocks in recv() until the server answers: the
// timeout is kept by the server. When the store's host is cut off (a network partition: no FIN, no
// RST ever arrives), nothing answers and the rank blocks for good; seen in hosts.partition, where
// rank 2 sat in a checkpoint's main_process_first long after its 3 s timeout while every other
// process had ended. So the wait and the read of rank 0's status run on a helper thread that owns
// its own reference to the store, and that is abandoned (detached) when it has not finished within
// the timeout plus 1 s; the rank then fails with the TimeoutError it would have had. The same is
// done for the arrival reports (see Note [Naming the ranks that did not arrive]).
void ProcessGroup::run_main_process_first(const std::function<void()>& f) {
  const std::string key = str("ddp/main_process_first/", state_->main_first_calls++);
  if (state_->info.rank == 0) {
    try {
      f();
    } catch (const std::exception& error) {
      state_->store->set(key, detail::to_bytes(str("error: ", error.what())));
      throw;
    }
    state_->store->set(key, detail::to_bytes("ok"));
    return;
  }
  // See Note [Bounded store wait].
  struct Shared {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::optional<std::string> status;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, store = state_->store, key, timeout = state_->info.timeout] {
    std::optional<std::string> status;
    try {
      store->wait({key}, timeout);
      status = detail::bytes_to_text(store->get(key));
    } catch (const std::exception&) {
    }
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->status = std::move(status);
    shared->done = true;
    shared->done_cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mutex);
  if (!shared->done_cv.wait_for(lock, state_->info.timeout + std::chrono::seconds(1), [&] { return shared->done; }) ||
      !shared->status) {
    throw TimeoutError(str("rank ", state_->info.rank, " waited ", detail::seconds_of(state_->info.timeout),
                           " s for rank 0 to finish its part of main_process_first"));
  }
  const std::string status = *shared->status;
  if (status != "ok") {
    throw CommunicationError(str("rank 0 failed in main_process_first, so rank ", state_->info.rank,
                                 " stops too: ", status));
  }
  f();
}

}  // namespace ddp
