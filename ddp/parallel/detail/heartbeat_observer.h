#pragma once
// The heartbeat to ddp_launch as an observer of DistributedDataParallel's iterations (internal):
// one datagram per training forward over the agent channel (see Note [Agent channel] in
// ddp/base/agent_message.h and Note [Heartbeat at forward]).
#include <cstdint>
#include <utility>

#include "ddp/runtime/agent_channel.h"
#include "ddp/parallel/detail/iteration_observer.h"

namespace ddp::detail {

class HeartbeatObserver : public IterationObserver {
 public:
  // `rank`: the launcher's name for this process (AgentEnvironment::rank), not the group's rank.
  HeartbeatObserver(AgentChannel channel, int rank) : channel_(std::move(channel)), rank_(rank) {}
  void on_training_forward(std::int64_t now_ns) override;
  void on_synchronized_backward(std::int64_t communication_ns, std::int64_t exposed_wait_ns) override {
    last_comm_ns_ = communication_ns;
    last_wait_ns_ = exposed_wait_ns;
  }
  void on_wait_outside(std::int64_t wait_ns) override { last_wait_ns_ += wait_ns; }
  // See Note [Heartbeat steps in a live job] in heartbeat_observer.cpp.
  void on_steps_set(std::int64_t steps) override {
    step_ = steps;
    last_heartbeat_ns_ = 0;
  }

 private:
  AgentChannel channel_;
  int rank_;
  std::int64_t last_heartbeat_ns_ = 0;
  std::int64_t last_comm_ns_ = 0;
  std::int64_t last_wait_ns_ = 0;
  std::int64_t step_ = 0;
};

}  // namespace ddp::detail
