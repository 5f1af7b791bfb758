#include "launcher/observe/agent_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/base/error.h"

namespace ddp::launcher::observe {

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
  // See Note [Agent sender credentials]: without them no message could be trusted, so fail loudly.
  const int on = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    ::rmdir(tmpl.c_str());
    throw ddp::IoError(ddp::str("cannot ask for the senders' credentials on the heartbeat socket ", path, ": ",
                                std::strerror(err)));
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

void AgentSocket::drain(const std::function<void(const AgentDatagram&)>& on_datagram) {
  // One byte more than a message, so that a longer datagram is seen as such (not cut to size).
  unsigned char buf[kAgentMessageBytes + 1];
  alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(ucred))];
  while (true) {
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: nothing more
    }
    AgentDatagram datagram;
    if ((msg.msg_flags & MSG_TRUNC) == 0) datagram.message = decode_agent_message(buf, static_cast<size_t>(n));
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len == CMSG_LEN(sizeof(ucred))) {
        ucred cred{};
        std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
        datagram.sender = SenderCredentials{cred.pid, cred.uid};
      } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        // Descriptors a sender passed (the buffer leaves no room for them, but be sure): not ours to keep.
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int passed = -1;
          std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof passed);
          ::close(passed);
        }
      }
    }
    on_datagram(datagram);
  }
}

}  // namespace ddp::launcher::observe
