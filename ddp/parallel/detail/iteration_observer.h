#pragma once
// Observers of DistributedDataParallel's iterations (internal, not installed): what watches the
// training loop from outside the gradient path (the launcher's heartbeat, ddp/parallel/detail/heartbeat_observer.h)
// is told where an iteration starts and what its communication took, and changes nothing.
#include <cstdint>

namespace ddp::detail {

class IterationObserver {
 public:
  virtual ~IterationObserver() = default;
  // A training forward outside no_sync() starts (at world size 1 too), at steady-clock `now_ns`.
  virtual void on_training_forward(std::int64_t now_ns) = 0;
  // A synchronized backward ended; its communication took `communication_ns` (first launch to
  // the end of the last bucket's work), of which backward waited `exposed_wait_ns` after its
  // compute (the peers' lag and the last bucket's transfer).
  virtual void on_synchronized_backward(std::int64_t communication_ns, std::int64_t exposed_wait_ns) = 0;
  // The training goes on after `steps` applied steps (DistributedDataParallel::continue_after_steps).
  virtual void on_steps_set(std::int64_t steps) { (void)steps; }
  // The iteration waited `wait_ns` in a collective outside the backward (DistributedDataParallel::count_wait).
  virtual void on_wait_outside(std::int64_t wait_ns) { (void)wait_ns; }
};

}  // namespace ddp::detail
