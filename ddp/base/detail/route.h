#pragma once
// Which address of this host a rank advertises to its peers, and where the master's store listens.
// Torch-free: the ddp library (the Gloo device, the TCPStore's socket) and ddp_launch (the
// rendezvous' advertised address and serving socket) share it. See Note [Advertised address].
#include <chrono>
#include <optional>
#include <string>
#include <vector>

struct sockaddr;

namespace ddp::detail {

// The numeric text of an IPv4 or IPv6 socket address; empty for another family.
std::string address_text(const sockaddr* sa);

// Note [Advertised address]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A rank tells its peers an address to connect to. The hostname's resolution (what Gloo's default
// device and c10d use) is the wrong one on a stock Debian host, whose /etc/hosts maps the hostname
// to 127.0.1.1: peers on other hosts would be told to connect to their own loopback. The right one
// is the local address of the interface that routes to the master, which is what the kernel's route
// lookup says: connect() a UDP socket to the master (nothing is sent) and read getsockname().
// - GLOO_SOCKET_IFNAME (a name, or a comma list for several devices) overrides, as in PyTorch.
// - A master given as a loopback address or "localhost" is a one-host job: loopback it is.
// - A master given as a name that resolves to loopback here (the master host's own Debian name)
//   while peers are on other hosts: the route says loopback, which peers cannot use, so the one
//   non-loopback interface that is up (with an address of the name's family) is taken; with several, the line names them and asks for
//   GLOO_SOCKET_IFNAME or an address (there is no telling which one the peers reach); with none,
//   the "other hosts" can only be this one, and loopback it is.
// - Nothing usable: one line naming what was tried (the name, its address, the route's answer,
//   the interfaces) and what to set.
// The master's store listens on the master address only (See Note [Loopback store] in
// ddp/distributed/process_group.cpp), except in the Debian-name case above, where peers reach this host by an
// address the name does not resolve to here: there it listens on every interface, as c10d does.

// One address of an interface that is up: name ("eth0") and numeric address.
struct NetworkInterface {
  std::string name;
  std::string address;
};

// What this host's resolver and routing table say about reaching the master.
struct RouteFacts {
  std::string master;                         // as given (MASTER_ADDR, the rendezvous endpoint's host)
  std::optional<std::string> master_address;  // its first numeric address; unset when it does not resolve
  std::optional<std::string> route_source;    // the kernel's source address towards it; unset: no route
  std::string problem;                        // why one of the two is unset
  std::vector<NetworkInterface> interfaces;   // non-loopback interfaces that are up, with a global address
};

// Asks the resolver and the kernel (no packet is sent).
RouteFacts look_up_route(const std::string& master);

// The non-loopback interfaces that are up, with their IPv4 and global IPv6 addresses.
std::vector<NetworkInterface> network_interfaces();

bool is_loopback_address(const std::string& numeric_address);

// Loopback by the user's own choice: a numeric loopback address or "localhost".
bool names_loopback(const std::string& host);

// How a rank makes its Gloo devices: interface names (GLOO_SOCKET_IFNAME), else one address.
struct AdvertisedAddress {
  std::vector<std::string> interfaces;
  std::string address;
};

// What the choice needs besides the facts; the words name the caller's own variables.
struct AdvertiseOptions {
  bool peers_on_other_hosts = false;
  std::optional<std::string> socket_ifname;  // GLOO_SOCKET_IFNAME's value; empty or unset: not given
  std::string master_name = "MASTER_ADDR";   // what the master was given as, for the error line
  std::string remedy = "set GLOO_SOCKET_IFNAME to the interface that reaches the other hosts";
};

// Chooses by Note [Advertised address]. Throws CommunicationError (one line) when nothing usable
// is found, InvalidArgument for a socket_ifname that names nothing.
AdvertisedAddress choose_advertised_address(const RouteFacts& facts, const AdvertiseOptions& options);

// Where the master's store listens: the master's own address, or the wildcard of its family
// ("0.0.0.0" or "::": every interface) in the Debian-name case of Note [Advertised address].
std::string store_listen_address(const RouteFacts& facts, bool peers_on_other_hosts);

// A socket listening on the numeric address:port, SO_REUSEADDR as c10d's store sets it.
// Returns the fd, or -1 with errno set (EADDRNOTAVAIL: not an address of this host).
int listen_on_address(const std::string& address, int port);

// Note [Bounded connect to the master]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// c10d's TCPStore client retries its connect with a back-off that overshoots the timeout (a 3 s
// timeout gave up after 6.3 s here) and the TCPStore options' timeout is also the store's default
// for every later get/wait, so it cannot simply be shortened. Ranks other than 0 therefore first
// wait, with a real deadline, until something accepts connections on MASTER_ADDR:MASTER_PORT; the
// TCPStore then connects at once. ddp_launch's rendezvous plugin does the same before it opens
// the rendezvous store as a client (a 30 s --rdzv_timeout gave up after more than 60 s). Returns
// false when the deadline passes first.
bool wait_until_listening(const std::string& host, int port, std::chrono::steady_clock::time_point deadline);

}  // namespace ddp::detail
