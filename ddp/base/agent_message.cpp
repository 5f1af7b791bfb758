#include "ddp/base/agent_message.h"

#include <chrono>
#include <cstring>

namespace ddp {

void encode_agent_message(const AgentMessage& m, unsigned char (&out)[kAgentMessageBytes]) {
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
  put(m.wait_time_s);
}

std::optional<AgentMessage> decode_agent_message(const void* data, std::size_t size) {
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
  get(m.wait_time_s);
  return m;
}

double wall_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace ddp
