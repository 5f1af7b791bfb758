// The advertised address and the store's listening address (ddp/base/detail/route.h): the choice from
// given facts, and the real resolver and routing table for what this host always has (loopback).
// Across real hosts: tests/hosts.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "ddp/base/error.h"
#include "ddp/base/detail/route.h"

namespace {

ddp::detail::RouteFacts facts(const std::string& master, const std::string& address, const std::string& source,
                      std::vector<ddp::detail::NetworkInterface> interfaces = {{"eth0", "198.18.0.2"}}) {
  ddp::detail::RouteFacts f;
  f.master = master;
  f.master_address = address;
  f.route_source = source;
  f.interfaces = std::move(interfaces);
  return f;
}

ddp::detail::AdvertisedAddress choose(const ddp::detail::RouteFacts& f, bool peers_on_other_hosts,
                              std::optional<std::string> socket_ifname = std::nullopt) {
  ddp::detail::AdvertiseOptions options;
  options.peers_on_other_hosts = peers_on_other_hosts;
  options.socket_ifname = std::move(socket_ifname);
  return ddp::detail::choose_advertised_address(f, options);
}

std::string error_of(const ddp::detail::RouteFacts& f, bool peers_on_other_hosts) {
  try {
    choose(f, peers_on_other_hosts);
  } catch (const ddp::CommunicationError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the advertised address is the route's source towards the master, not the hostname's", "[route]") {
  // host1 reaching a master on host0: whatever the hostname resolves to, the route's source wins.
  const auto chosen = choose(facts("198.18.0.1", "198.18.0.1", "198.18.0.2"), true);
  CHECK(chosen.address == "198.18.0.2");
  CHECK(chosen.interfaces.empty());
  // A one-host job on loopback stays there, also with several "nodes".
  CHECK(choose(facts("127.0.0.1", "127.0.0.1", "127.0.0.1"), true).address == "127.0.0.1");
  CHECK(choose(facts("localhost", "127.0.0.1", "127.0.0.1"), true).address == "127.0.0.1");
  // The master host's own Debian name (127.0.1.1 here) in a one-host job: loopback is right.
  CHECK(choose(facts("host0", "127.0.1.1", "127.0.0.1"), false).address == "127.0.0.1");
}

TEST_CASE("a name that resolves to loopback is never advertised to peers on other hosts", "[route]") {
  const auto chosen = choose(facts("host0", "127.0.1.1", "127.0.0.1"), true);
  CHECK(chosen.address == "198.18.0.2");
  // Two interfaces: there is no telling which one the peers reach.
  const std::string two = error_of(facts("host0", "127.0.1.1", "127.0.0.1",
                                         {{"eth0", "198.18.0.2"}, {"ib0", "198.19.0.2"}}),
                                   true);
  CHECK_THAT(two, Catch::Contains("MASTER_ADDR host0 resolves to 127.0.1.1") &&
                      Catch::Contains("eth0 198.18.0.2, ib0 198.19.0.2") && Catch::Contains("GLOO_SOCKET_IFNAME"));
  CHECK(two.find('\n') == std::string::npos);
  // An IPv4 and a global IPv6 address on one interface: one candidate for an IPv4 master.
  CHECK(choose(facts("host0", "127.0.1.1", "127.0.0.1", {{"eth0", "198.18.0.2"}, {"eth0", "fd00::2"}}), true)
            .address == "198.18.0.2");
  // No network interface at all: every "node" is on this host, so loopback is right.
  CHECK(choose(facts("host0", "127.0.1.1", "127.0.0.1", {}), true).address == "127.0.0.1");
}

TEST_CASE("GLOO_SOCKET_IFNAME overrides, one device per name", "[route]") {
  const auto f = facts("198.18.0.1", "198.18.0.1", "198.18.0.2");
  CHECK(choose(f, true, std::string("eth1")).interfaces == std::vector<std::string>{"eth1"});
  CHECK(choose(f, true, std::string("eth1,eth2")).interfaces == std::vector<std::string>{"eth1", "eth2"});
  CHECK(choose(f, true, std::string("eth1,eth2")).address.empty());
  CHECK(choose(f, true, std::string("")).address == "198.18.0.2");
  CHECK_THROWS_AS(choose(f, true, std::string(",")), ddp::InvalidArgument);
}

TEST_CASE("no route or no address: one line naming what was tried", "[route]") {
  const auto unresolved = ddp::detail::look_up_route("no-such-host.invalid");
  CHECK_FALSE(unresolved.master_address);
  const std::string what = error_of(unresolved, true);
  CHECK_THAT(what, Catch::Contains("tried the route to MASTER_ADDR no-such-host.invalid") &&
                       Catch::Contains("does not resolve") && Catch::Contains("interfaces up:"));
  CHECK(what.find('\n') == std::string::npos);
}

TEST_CASE("the kernel's route lookup on this host", "[route]") {
  const auto loopback = ddp::detail::look_up_route("127.0.0.1");
  REQUIRE(loopback.route_source);
  CHECK(*loopback.route_source == "127.0.0.1");
  const auto debian = ddp::detail::look_up_route("127.0.1.1");
  REQUIRE(debian.route_source);
  CHECK(ddp::detail::is_loopback_address(*debian.route_source));
  for (const auto& i : ddp::detail::network_interfaces()) CHECK_FALSE(ddp::detail::is_loopback_address(i.address));
  CHECK(ddp::detail::is_loopback_address("127.0.1.1"));
  CHECK(ddp::detail::is_loopback_address("::1"));
  CHECK_FALSE(ddp::detail::is_loopback_address("198.18.0.1"));
  CHECK(ddp::detail::names_loopback("localhost"));
  CHECK_FALSE(ddp::detail::names_loopback("host0"));
}

TEST_CASE("the store listens on the master address, every interface only for a name on loopback", "[route]") {
  CHECK(ddp::detail::store_listen_address(facts("198.18.0.1", "198.18.0.1", "198.18.0.1"), true) == "198.18.0.1");
  CHECK(ddp::detail::store_listen_address(facts("127.0.0.1", "127.0.0.1", "127.0.0.1"), true) == "127.0.0.1");
  CHECK(ddp::detail::store_listen_address(facts("host0", "127.0.1.1", "127.0.0.1"), false) == "127.0.1.1");
  CHECK(ddp::detail::store_listen_address(facts("host0", "127.0.1.1", "127.0.0.1"), true) == "0.0.0.0");
  // A real socket: bound to exactly the address, and a foreign address is EADDRNOTAVAIL.
  const int fd = ddp::detail::listen_on_address("127.0.0.1", 0);
  REQUIRE(fd >= 0);
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0);
  ::close(fd);
  CHECK(ddp::detail::listen_on_address("198.18.255.254", 0) == -1);
  CHECK(errno == EADDRNOTAVAIL);
}
