#pragma once
// The worker's end of the channel to its launcher: the sender DistributedDataParallel's heartbeat
// uses, and ProgressReporter for a training loop's samples and loss. The wire format is
// ddp/base/agent_message.h (shared with the launcher); this side is the ddp library's only.
// See Note [Agent channel] in ddp/base/agent_message.h.
#include <cstdint>
#include <optional>
#include <string>

#include "ddp/base/agent_message.h"
#include "ddp/base/worker_variables.h"

namespace ddp {

// The sending end. Opens the socket lazily at the first send; inactive (every call a no-op) when
// constructed without a path.
class AgentChannel {
 public:
  AgentChannel() = default;
  explicit AgentChannel(std::string socket_path) : path_(std::move(socket_path)) {}
  // DDP_AGENT_SOCKET of env (see parse_agent_environment in ddp/base/worker_variables.h).
  static AgentChannel from_environment(const EnvLookup& env);
  ~AgentChannel();
  AgentChannel(AgentChannel&& other) noexcept;
  AgentChannel& operator=(AgentChannel&& other) noexcept;
  AgentChannel(const AgentChannel&) = delete;
  AgentChannel& operator=(const AgentChannel&) = delete;

  bool active() const { return !path_.empty() && !broken_; }
  // Never blocks, never throws: a message that cannot go out now is dropped.
  void send(const AgentMessage& message) noexcept;

 private:
  std::string path_;
  int fd_ = -1;
  bool broken_ = false;  // the socket could not be opened: stop trying
};

// What a training loop reports beyond DDP's automatic heartbeat:
//   ddp::ProgressReporter progress;             // reads DDP_AGENT_SOCKET and RANK once
//   ... each step: progress.report(batch_size, loss.item<double>());
// Each report is one datagram and also counts as a heartbeat for ddp_launch --hang_timeout (use
// report(0) in long evaluation loops). A no-op when the launcher does not listen.
class ProgressReporter {
 public:
  explicit ProgressReporter(const EnvLookup& env = process_environment());
  // Adds `samples` to this rank's cumulative count and sends it, with the loss when given.
  void report(std::int64_t samples, std::optional<double> loss = std::nullopt) noexcept;
  bool active() const { return channel_.active(); }
  std::int64_t samples() const { return samples_; }

 private:
  AgentChannel channel_;
  int rank_ = 0;
  std::int64_t samples_ = 0;
};

}  // namespace ddp
