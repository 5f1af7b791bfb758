#include "ddp/base/agent_message.h"

#include <chrono>
#include <cstring>

namespace ddp {

void encode_agent_message(const AgentMessage& m, unsigned char (&out)[kAgentMessageBytes]) {
  std::memset(out, 0, sizeof out);
  std::size_t at = 0;
  const auto put = [&](const auto&... fields) {  // in order, each at its size
    ((std::memcpy(out + at, &fields, sizeof fields), at += sizeof fields), ...);
  };
  put(kAgentMagic, m.flags, std::uint16_t{0}, m.rank, m.pid, m.step, m.samples, m.step_time_s, m.comm_time_s, m.loss,
      m.timestamp_s, m.wait_time_s);
}

std::optional<AgentMessage> decode_agent_message(const void* data, std::size_t size) {
  if (size != kAgentMessageBytes) return std::nullopt;
  const auto* in = static_cast<const unsigned char*>(data);
  std::size_t at = 0;
  const auto get = [&](auto&... fields) {  // in put's order
    ((std::memcpy(&fields, in + at, sizeof fields), at += sizeof fields), ...);
  };
  std::uint32_t magic = 0;
  std::uint16_t pad = 0;
  AgentMessage m;
  get(magic);
  if (magic != kAgentMagic) return std::nullopt;
  get(m.flags, pad, m.rank, m.pid, m.step, m.samples, m.step_time_s, m.comm_time_s, m.loss, m.timestamp_s,
      m.wait_time_s);
  return m;
}

double wall_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace ddp
