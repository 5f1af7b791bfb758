#include "launcher/agent_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "ddp/base/error.h"

namespace ddp::launcher {

std::unique_ptr<AgentSocket> AgentSocket::open(const std::string& parent) {
  constexpr const char* kName = "/agent.sock";
  std::string tmpl = parent + "/ddp_agent_XXXXXX";
  if (tmpl.size() + std::strlen(kName) >= sizeof(sockaddr_un{}.sun_path)) tmpl = "/tmp/ddp_agent_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {  // mkdtemp creates the folder with mode 0700
    throw ddp::IoError(ddp::str("cannot create a folder for the heartbeat socket under ", parent, ": ",
                                std::strerror(errno)));
  }
  const std::string path = tmpl + kName;
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::rmdir(tmpl.c_str());
    throw ddp::IoError(ddp::str("cannot create the heartbeat socket ", path, ": ", std::strerror(err)));
  }
  // Room for bursts (every rank's heartbeat at once, a slow scrape): 64 KiB holds few messages.
  const int buffer = 1 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  return std::unique_ptr<AgentSocket>(new AgentSocket(fd, tmpl, path));
}

AgentSocket::~AgentSocket() {
  ::close(fd_);
  ::unlink(path_.c_str());
  ::rmdir(dir_.c_str());
}

void AgentSocket::drain(const std::function<void(const AgentMessage&)>& on_message) {
  unsigned char buf[256];
  while (true) {
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: nothing more
    }
    if (auto m = decode_agent_message(buf, static_cast<size_t>(n))) on_message(*m);
  }
}

}  // namespace ddp::launcher
