#pragma once
// The launcher's end of the workers' heartbeat channel (see Note [Agent channel] in ddp/base/agent_message.h):
// a Unix-domain datagram socket in a private folder, read by the supervisor's poll loop. Every
// datagram comes with the kernel's word on who sent it: see Note [Agent sender credentials].
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddp/base/agent_message.h"

namespace ddp::launcher::observe {

// Note [Agent sender credentials]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The folder of the socket is private (0700), but every process of the job's user can still write
// to it, and the pid in an AgentMessage is whatever the sender wrote: a stray or hostile process
// could send keep-alives for a hung rank and hide the hang from the watchdog. So the socket has
// SO_PASSCRED set: the kernel attaches the sending process's pid (its thread group id, translated
// into the launcher's pid namespace) and uid to every datagram (SCM_CREDENTIALS), and a process
// cannot claim another pid or uid there without CAP_SYS_ADMIN / CAP_SETUID. ProgressBoard::record
// accepts a message only when those credentials name a worker this launcher started in the current
// attempt, with the rank the message claims and the pid it reports, running as the launcher's user;
// everything else is dropped and counted (ddp_launch_agent_messages_dropped_total). A worker's
// forked children (data loader processes) have pids of their own, so only the worker itself is
// heard, as before. Root can forge credentials: it is outside what this check can keep out.

// Who sent a datagram, according to the kernel (SCM_CREDENTIALS).
struct SenderCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
};

// One datagram as it arrived.
struct AgentDatagram {
  std::optional<AgentMessage> message;      // nullopt: not a message of this version
  std::optional<SenderCredentials> sender;  // nullopt: the kernel attached none
};

class AgentSocket {
 public:
  // Creates a folder (mode 0700) under `parent` and binds parent/ddp_agent_XXXXXX/agent.sock in it,
  // with SO_PASSCRED set. Falls back to /tmp when the path would be too long for a socket address.
  // Throws ddp::IoError.
  static std::unique_ptr<AgentSocket> open(const std::string& parent);
  ~AgentSocket();  // closes the socket and removes the folder
  AgentSocket(const AgentSocket&) = delete;
  AgentSocket& operator=(const AgentSocket&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Reads every datagram waiting (never blocks), malformed ones included: the receiver judges them
  // (ProgressBoard::record).
  void drain(const std::function<void(const AgentDatagram&)>& on_datagram);

 private:
  AgentSocket(int fd, std::string dir, std::string path) : fd_(fd), dir_(std::move(dir)), path_(std::move(path)) {}
  int fd_;
  std::string dir_;
  std::string path_;
};

}  // namespace ddp::launcher::observe
