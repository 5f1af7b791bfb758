#pragma once
// The launcher's end of the workers' heartbeat channel (Note [Agent channel] in ddp/base/agent_message.h):
// a Unix-domain datagram socket in a private folder, read by the supervisor's poll loop.
#include <functional>
#include <memory>
#include <string>

#include "ddp/base/agent_message.h"

namespace ddp::launcher {

class AgentSocket {
 public:
  // Creates a folder (mode 0700) under `parent` and binds parent/ddp_agent_XXXXXX/agent.sock in it.
  // Falls back to /tmp when the path would be too long for a socket address. Throws ddp::IoError.
  static std::unique_ptr<AgentSocket> open(const std::string& parent);
  ~AgentSocket();  // closes the socket and removes the folder
  AgentSocket(const AgentSocket&) = delete;
  AgentSocket& operator=(const AgentSocket&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Reads every datagram waiting (never blocks); malformed ones are dropped.
  void drain(const std::function<void(const AgentMessage&)>& on_message);

 private:
  AgentSocket(int fd, std::string dir, std::string path) : fd_(fd), dir_(std::move(dir)), path_(std::move(path)) {}
  int fd_;
  std::string dir_;
  std::string path_;
};

}  // namespace ddp::launcher
