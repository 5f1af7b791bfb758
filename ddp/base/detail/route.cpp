#include "ddp/base/detail/route.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "ddp/base/error.h"
#include "ddp/base/str.h"

namespace ddp::detail {

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

namespace {

// Numeric address text of the first result for host:port; the socket address in *out when given.
std::optional<std::string> resolve(const std::string& host, int port, int socktype, int flags,
                                   sockaddr_storage* out, socklen_t* out_length, std::string& problem) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = AI_NUMERICSERV | flags;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    problem = str("'", host, "' does not resolve (", ::gai_strerror(rc), ")");
    return std::nullopt;
  }
  std::string text = address_text(found->ai_addr);
  if (out != nullptr) {
    std::memcpy(out, found->ai_addr, found->ai_addrlen);
    *out_length = found->ai_addrlen;
  }
  ::freeaddrinfo(found);
  return text;
}

std::string describe(const std::vector<NetworkInterface>& interfaces) {
  if (interfaces.empty()) return "none";
  std::vector<std::string> named;
  for (const auto& i : interfaces) named.push_back(i.name + " " + i.address);
  return join(named, ", ");
}

bool is_ipv6(const std::string& numeric_address) { return numeric_address.find(':') != std::string::npos; }

// The Debian-name case of Note [Advertised address]: a name that resolves to loopback here.
bool is_name_on_loopback(const RouteFacts& facts) {
  return !names_loopback(facts.master) && facts.master_address && is_loopback_address(*facts.master_address);
}

}  // namespace

bool is_loopback_address(const std::string& numeric_address) {
  in_addr v4{};
  if (::inet_pton(AF_INET, numeric_address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, numeric_address.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

bool names_loopback(const std::string& host) { return host == "localhost" || is_loopback_address(host); }

std::vector<NetworkInterface> network_interfaces() {
  std::vector<NetworkInterface> found;
  ifaddrs* head = nullptr;
  if (::getifaddrs(&head) != 0) return found;
  for (ifaddrs* i = head; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    const int family = i->ifa_addr->sa_family;
    if (family == AF_INET6) {
      const auto& a6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&a6)) continue;  // needs a scope id, which peers do not have
    } else if (family != AF_INET) {
      continue;
    }
    found.push_back({i->ifa_name, address_text(i->ifa_addr)});
  }
  ::freeifaddrs(head);
  return found;
}

RouteFacts look_up_route(const std::string& master) {
  RouteFacts facts;
  facts.master = master;
  facts.interfaces = network_interfaces();
  sockaddr_storage target{};
  socklen_t target_length = 0;
  // Any port: a UDP connect() only asks the routing table.
  facts.master_address = resolve(master, 9, SOCK_DGRAM, 0, &target, &target_length, facts.problem);
  if (!facts.master_address) return facts;
  const int fd = ::socket(target.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage source{};
  socklen_t source_length = sizeof source;
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&target), target_length) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&source), &source_length) != 0) {
    facts.problem = str("no route from this host to ", *facts.master_address, " (", std::strerror(errno), ")");
  } else {
    facts.route_source = address_text(reinterpret_cast<sockaddr*>(&source));
  }
  if (fd >= 0) ::close(fd);
  return facts;
}

AdvertisedAddress choose_advertised_address(const RouteFacts& facts, const AdvertiseOptions& options) {
  AdvertisedAddress chosen;
  const std::optional<std::string>& socket_ifname = options.socket_ifname;
  if (socket_ifname && !socket_ifname->empty()) {
    std::string rest = *socket_ifname;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      std::string name = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      if (!name.empty()) chosen.interfaces.push_back(name);
    }
    if (chosen.interfaces.empty()) {
      throw InvalidArgument(str("GLOO_SOCKET_IFNAME='", *socket_ifname,
                                "' names no interface: give a name (eth0) or a comma list (eth0,eth1)"));
    }
    return chosen;
  }
  const std::string tried = str(options.master_name, " ", facts.master);
  const std::string remedy = "; " + options.remedy;
  if (!facts.master_address || !facts.route_source) {
    throw CommunicationError(str("no address to advertise to the other ranks: tried the route to ", tried, ": ",
                                 facts.problem, "; interfaces up: ", describe(facts.interfaces), remedy));
  }
  // No network interface at all: the "other hosts" can only be this one (nodes simulated on one host).
  if (!is_loopback_address(*facts.route_source) || !options.peers_on_other_hosts || names_loopback(facts.master) ||
      facts.interfaces.empty()) {
    chosen.address = *facts.route_source;
    return chosen;
  }
  // Peers reach the master's name over the family it resolves to (an interface usually has an IPv4
  // and a global IPv6 address: one candidate, not two).
  std::vector<NetworkInterface> candidates;
  for (const auto& i : facts.interfaces) {
    if (is_ipv6(i.address) == is_ipv6(*facts.master_address)) candidates.push_back(i);
  }
  if (candidates.size() == 1) {
    chosen.address = candidates.front().address;
    return chosen;
  }
  throw CommunicationError(str("no address to advertise to the other ranks: ", tried, " resolves to ",
                               *facts.master_address, " here, a loopback address the other hosts cannot reach, "
                               "and the non-loopback interfaces up are: ", describe(candidates),
                               remedy, ", or give ", options.master_name, " as this host's network address"));
}

std::string store_listen_address(const RouteFacts& facts, bool peers_on_other_hosts) {
  if (!facts.master_address) return "";
  if (peers_on_other_hosts && is_name_on_loopback(facts)) {
    return is_ipv6(*facts.master_address) ? "::" : "0.0.0.0";
  }
  return *facts.master_address;
}

int listen_on_address(const std::string& address, int port) {
  sockaddr_storage where{};
  socklen_t length = 0;
  std::string problem;
  if (!resolve(address, port, SOCK_STREAM, AI_NUMERICHOST | AI_PASSIVE, &where, &length, problem)) {
    errno = EINVAL;
    return -1;
  }
  const int fd = ::socket(where.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int on = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0 &&
      ::bind(fd, reinterpret_cast<sockaddr*>(&where), length) == 0 && ::listen(fd, SOMAXCONN) == 0) {
    return fd;
  }
  const int error = errno;
  ::close(fd);
  errno = error;
  return -1;
}

bool wait_until_listening(const std::string& host, int port, std::chrono::steady_clock::time_point deadline) {
  using std::chrono::steady_clock;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  auto backoff = std::chrono::milliseconds(20);
  while (true) {
    addrinfo* found = nullptr;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) == 0) {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        if (!connected && errno == EINPROGRESS) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady_clock::now());
          pollfd pfd{fd, POLLOUT, 0};
          if (::poll(&pfd, 1, static_cast<int>(std::clamp<long long>(left.count(), 0, 1000))) == 1) {
            int error = 0;
            socklen_t length = sizeof error;
            connected = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
          }
        }
        ::close(fd);
        if (connected) {
          ::freeaddrinfo(found);
          return true;
        }
      }
      ::freeaddrinfo(found);
    }
    const auto now = steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<steady_clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace ddp::detail
