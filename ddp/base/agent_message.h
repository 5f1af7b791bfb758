#pragma once
// The wire format of the local channel from a worker to its launcher (ddp_launch --hang_timeout /
// --metrics_port): small fixed-format datagrams on a Unix-domain socket whose path the launcher puts
// in DDP_AGENT_SOCKET. Both ends include this; the worker's sender is ddp/runtime/agent_channel.h (libddp),
// the launcher's receiver launcher/observe/agent_socket.h. Torch-free. See Note [Agent channel].
#include <cstddef>
#include <cstdint>
#include <optional>

namespace ddp {

// Note [Agent channel]
// ~~~~~~~~~~~~~~~~~~~~
// Workers never wait for the launcher: the socket is non-blocking and a datagram that does not fit
// (EAGAIN) or has no reader is dropped, because a heartbeat is only worth something when it is
// fresh. DistributedDataParallel sends one datagram (one send syscall) per synchronized iteration;
// a training loop may add samples and loss with ProgressReporter (ddp/runtime/agent_channel.h). Without
// DDP_AGENT_SOCKET nothing is opened and nothing is sent. (DDP sends at the start of each
// synchronizing forward: see Note [Heartbeat at forward] in distributed_data_parallel.cpp.) The
// launcher (launcher/observe/agent_socket.h) creates the socket in a private folder (0700), so only the
// job's user can write to it; it checks rank and pid of each message against the workers it
// started and drops anything else. The format is fixed-size, native byte order (both ends are on
// one machine) and versioned by kAgentMagic. The wire format is torch-free and shared (ddp/base);
// the sender lives in the ddp library only, so the launcher never sees a class it cannot use.
struct AgentMessage {
  // Bits of `flags`: which fields are set.
  static constexpr std::uint16_t kHasStep = 1;     // step, step_time_s, comm_time_s, wait_time_s (DDP's heartbeat)
  static constexpr std::uint16_t kHasSamples = 2;  // samples (cumulative samples this rank trained)
  static constexpr std::uint16_t kHasLoss = 4;     // loss
  std::uint16_t flags = 0;
  std::int32_t rank = 0;
  std::int32_t pid = 0;
  std::int64_t step = 0;          // the synchronized iteration (1-based) this process is entering
  std::int64_t samples = 0;
  double step_time_s = 0;         // wall time of the previous iteration (heartbeat to heartbeat)
  double comm_time_s = 0;         // all-reduce time of the previous iteration (first launch to last done)
  // The part of comm_time_s the previous iteration's backward waited for after its own compute: a
  // straggler's peers wait for it, it waits least (See Note [Stragglers] in launcher/observe/straggler.h).
  double wait_time_s = 0;
  double loss = 0;
  double timestamp_s = 0;         // worker's wall clock, seconds since the Unix epoch
};

inline constexpr std::uint32_t kAgentMagic = 0x32504444;  // "DDP2"
inline constexpr std::size_t kAgentMessageBytes = 72;

// Fixed layout: magic u32, flags u16, pad u16, rank i32, pid i32, step i64, samples i64,
// step_time f64, comm_time f64, loss f64, timestamp f64, wait_time f64 = 72 bytes.
void encode_agent_message(const AgentMessage& message, unsigned char (&out)[kAgentMessageBytes]);

// nullopt when the bytes are not one message of this version.
std::optional<AgentMessage> decode_agent_message(const void* data, std::size_t size);

// Wall clock seconds since the Unix epoch (AgentMessage::timestamp_s).
double wall_seconds_now();

}  // namespace ddp
