#pragma once
// Small socket helpers for ports and addresses (no LibTorch).
#include <string>

namespace ddp::launcher::process {

enum class BindProbe { kFree, kInUse, kNotLocal, kUnresolvable };

// Tries to bind host:port (with SO_REUSEADDR, as c10d's store does) and closes the socket again.
BindProbe probe_bind(const std::string& host, int port);

// A socket listening on exactly host:port (SO_REUSEADDR, as c10d's store does), for a server that
// must serve only the address it was given (See Note [Loopback store] in ddp/distributed/process_group.cpp). -1 when
// host:port cannot be bound here (in use, or not an address of this machine).
int listen_on(const std::string& host, int port);

// A port that was free on host a moment ago (bind to port 0). Throws UsageError when host has
// no local address to bind.
int pick_free_port(const std::string& host);

// The port a bound socket has (the one the OS picked for port 0); -1 when it cannot be read.
int bound_port(int fd);
// The numeric address of a socket's own end ("0.0.0.0" bound to every interface), or of its peer's;
// "" when it cannot be read.
std::string socket_address(int fd, bool peer);

// gethostname(), for the failure summary.
std::string this_host_name();

}  // namespace ddp::launcher::process
