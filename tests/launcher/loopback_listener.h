#pragma once
// A listening socket on 127.0.0.1 at a free port, for the tests of the launchers' channels (the job
// channel, the live job's liveness channel): the server under test takes the descriptor.
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include "ddp/base/detail/route.h"

namespace ddp::launcher::testing {

struct LoopbackListener {
  int fd = -1;
  int port = 0;
};

inline LoopbackListener listen_on_free_loopback_port() {
  LoopbackListener listener;
  listener.fd = ddp::detail::listen_on_address("127.0.0.1", 0);
  REQUIRE(listener.fd >= 0);
  sockaddr_in where{};
  socklen_t len = sizeof where;
  REQUIRE(::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&where), &len) == 0);
  listener.port = ntohs(where.sin_port);
  return listener;
}

}  // namespace ddp::launcher::testing
