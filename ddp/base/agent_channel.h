#pragma once
// The local channel from a worker to its launcher (ddp_launch --hang_timeout / --metrics_port):
// small fixed-format datagrams on a Unix-domain socket whose path the launcher puts in
// DDP_AGENT_SOCKET. Torch-free. See Note [Agent channel].
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "ddp/base/environment.h"

namespace ddp {

// Note [Agent channel]
// Workers never wait for the launcher: the socket is non-blocking and a datagram that does not fit
// (EAGAIN) or has no reader is dropped, because a heartbeat is only worth something when it is
// fresh. DistributedDataParallel sends one datagram (one send syscall) per synchronized
// iteration; a training loop may add samples and loss with ProgressReporter. Without
// DDP_AGENT_SOCKET nothing is opened and nothing is sent. (DDP sends at the start of each
// synchronizing forward: see Note [Heartbeat at forward] in distributed_data_parallel.cpp.) The launcher creates the socket in a
// private folder (0700), so only the job's user can write to it; it checks rank and pid of each
// message against the workers it started and drops anything else. The format is fixed-size,
// native byte order (both ends are on one machine) and versioned by kAgentMagic.
struct AgentMessage {
  enum Flags : std::uint16_t {
    kHasStep = 1,     // step, step_time_s, comm_time_s are set (DDP's per-iteration heartbeat)
    kHasSamples = 2,  // samples is set (cumulative samples this rank trained)
    kHasLoss = 4,     // loss is set
  };
  std::uint16_t flags = 0;
  std::int32_t rank = 0;
  std::int32_t pid = 0;
  std::int64_t step = 0;          // the synchronized iteration (1-based) this process is entering
  std::int64_t samples = 0;
  double step_time_s = 0;         // wall time of the previous iteration (heartbeat to heartbeat)
  double comm_time_s = 0;         // all-reduce time of the previous iteration (first launch to last done)
  double loss = 0;
  double timestamp_s = 0;         // worker's wall clock, seconds since the Unix epoch
};

constexpr std::uint32_t kAgentMagic = 0x31504444;  // "DDP1"
constexpr std::size_t kAgentMessageBytes = 64;

// Fixed layout: magic u32, flags u16, pad u16, rank i32, pid i32, step i64, samples i64,
// step_time f64, comm_time f64, loss f64, timestamp f64 = 64 bytes.
inline void encode_agent_message(const AgentMessage& m, unsigned char (&out)[kAgentMessageBytes]) {
  std::memset(out, 0, sizeof out);
  std::size_t at = 0;
  const auto put = [&](const auto& v) {
    std::memcpy(out + at, &v, sizeof v);
    at += sizeof v;
  };
  put(kAgentMagic);
  put(m.flags);
  put(std::uint16_t{0});
  put(m.rank);
  put(m.pid);
  put(m.step);
  put(m.samples);
  put(m.step_time_s);
  put(m.comm_time_s);
  put(m.loss);
  put(m.timestamp_s);
}

// nullopt when the bytes are not one message of this version.
inline std::optional<AgentMessage> decode_agent_message(const void* data, std::size_t size) {
  if (size != kAgentMessageBytes) return std::nullopt;
  const auto* in = static_cast<const unsigned char*>(data);
  std::size_t at = 0;
  const auto get = [&](auto& v) {
    std::memcpy(&v, in + at, sizeof v);
    at += sizeof v;
  };
  std::uint32_t magic = 0;
  std::uint16_t pad = 0;
  AgentMessage m;
  get(magic);
  if (magic != kAgentMagic) return std::nullopt;
  get(m.flags);
  get(pad);
  get(m.rank);
  get(m.pid);
  get(m.step);
  get(m.samples);
  get(m.step_time_s);
  get(m.comm_time_s);
  get(m.loss);
  get(m.timestamp_s);
  return m;
}

// The sending end. Opens the socket lazily at the first send; inactive (every call a no-op) when
// constructed without a path.
class AgentChannel {
 public:
  AgentChannel() = default;
  explicit AgentChannel(std::string socket_path) : path_(std::move(socket_path)) {}
  // DDP_AGENT_SOCKET of env (see parse_agent_environment in ddp/environment.h).
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

// Wall clock seconds since the Unix epoch (AgentMessage::timestamp_s).
double wall_seconds_now();

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
