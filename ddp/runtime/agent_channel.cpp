#include "ddp/runtime/agent_channel.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <utility>

namespace ddp {

AgentChannel AgentChannel::from_environment(const EnvLookup& env) {
  const auto agent = parse_agent_environment(env);
  return AgentChannel(agent ? agent->socket_path : std::string());
}

AgentChannel::~AgentChannel() {
  if (fd_ >= 0) ::close(fd_);
}

AgentChannel::AgentChannel(AgentChannel&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), broken_(other.broken_) {}

AgentChannel& AgentChannel::operator=(AgentChannel&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    broken_ = other.broken_;
  }
  return *this;
}

void AgentChannel::send(const AgentMessage& message) noexcept {
  if (!active()) return;
  if (fd_ < 0) {
    // connect() once, so that each message is a single send() (see Note [Agent channel]).
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (fd_ < 0 || path_.size() >= sizeof addr.sun_path) {
      broken_ = true;
      return;
    }
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      fd_ = -1;
      broken_ = true;  // no launcher listens (any more): stay silent
      return;
    }
  }
  unsigned char bytes[kAgentMessageBytes];
  encode_agent_message(message, bytes);
  [[maybe_unused]] const ssize_t n = ::send(fd_, bytes, sizeof bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
}

ProgressReporter::ProgressReporter(const EnvLookup& env) {
  if (const auto agent = parse_agent_environment(env)) {
    channel_ = AgentChannel(agent->socket_path);
    rank_ = agent->rank;
  }
}

void ProgressReporter::report(std::int64_t samples, std::optional<double> loss) noexcept {
  samples_ += samples;
  if (!channel_.active()) return;
  AgentMessage m;
  m.flags = AgentMessage::kHasSamples | (loss ? AgentMessage::kHasLoss : 0);
  m.rank = rank_;
  m.pid = static_cast<std::int32_t>(::getpid());
  m.samples = samples_;
  m.loss = loss.value_or(0.0);
  m.timestamp_s = wall_seconds_now();
  channel_.send(m);
}

}  // namespace ddp
