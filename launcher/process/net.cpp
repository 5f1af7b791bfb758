#include "launcher/process/net.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "ddp/base/detail/route.h"
#include "ddp/base/error.h"

namespace ddp::launcher::process {
namespace {

struct AddrList {
  addrinfo* head = nullptr;
  ~AddrList() {
    if (head != nullptr) ::freeaddrinfo(head);
  }
};

bool resolve(const std::string& host, int port, int socktype, AddrList& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = AI_NUMERICSERV;
  return ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &out.head) == 0;
}

}  // namespace

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

BindProbe probe_bind(const std::string& host, int port) {
  AddrList addrs;
  if (!resolve(host, port, SOCK_STREAM, addrs)) return BindProbe::kUnresolvable;
  BindProbe result = BindProbe::kNotLocal;
  for (addrinfo* a = addrs.head; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const int rc = ::bind(fd, a->ai_addr, a->ai_addrlen);
    const int err = errno;
    ::close(fd);
    if (rc == 0) return BindProbe::kFree;
    if (err == EADDRINUSE) result = BindProbe::kInUse;
  }
  return result;
}

int listen_on(const std::string& host, int port) {
  AddrList addrs;
  if (!resolve(host, port, SOCK_STREAM, addrs)) return -1;
  for (addrinfo* a = addrs.head; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) return fd;
    ::close(fd);
  }
  return -1;
}

std::string socket_address(int fd, bool peer) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if ((peer ? ::getpeername : ::getsockname)(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  return ddp::detail::address_text(reinterpret_cast<const sockaddr*>(&addr));
}

int pick_free_port(const std::string& host) {
  AddrList addrs;
  if (!resolve(host, 0, SOCK_STREAM, addrs)) {
    throw UsageError(ddp::str("cannot resolve master address '", host, "'"));
  }
  for (addrinfo* a = addrs.head; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int port = -1;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0) port = bound_port(fd);
    ::close(fd);
    if (port > 0) return port;
  }
  throw UsageError(ddp::str("--master_port 0: cannot bind a port on '", host,
                            "' (not an address of this machine?)"));
}

std::string this_host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace ddp::launcher::process
