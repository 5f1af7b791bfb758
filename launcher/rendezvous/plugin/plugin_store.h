#pragma once
// What both parts of the rendezvous plugin (rdzv_plugin.cpp: one fixed-size round;
// rdzv_plugin_rounds.cpp: elastic rounds) do with c10d's TCPStore. Only the plugin includes it.
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include "ddp/base/detail/route.h"
#include "ddp/base/detail/store_values.h"
#include "ddp/base/str.h"
#include "launcher/rendezvous/plugin/plugin_api.h"

namespace ddp::launcher::rdzv_plugin {

struct Handle {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string run_id;
  std::string token;
  int nnodes = 0;  // elastic: 0 (ddp_rdzv_release waits for nobody)
  bool is_server = false;
  double timeout_s = 0;
  std::string where;  // "host:port"
  int max_nodes = 0;  // elastic: the job's max_nodes
};

inline void set_error(char* error, std::size_t size, const std::string& text) {
  std::snprintf(error, size, "%s", text.c_str());
}

// c10d's exceptions carry a backtrace in what(): only the first line, without it.
inline std::string one_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  return ddp::first_line(what);
}

inline std::optional<std::string> try_get(c10d::TCPStore& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  return ddp::detail::bytes_to_text(store.get(key));
}

// Writes `mine` to `key` unless it holds a valid claim of another launcher; returns what the key
// holds afterwards.
inline std::string claim(c10d::TCPStore& store, const std::string& key, const std::string& mine,
                         const std::function<bool(const std::string&)>& is_launchers) {
  std::string current = ddp::detail::bytes_to_text(store.compareSet(key, {}, ddp::detail::to_bytes(mine)));
  if (current == mine || is_launchers(current)) return current;
  // Foreign bytes or a launcher that left: take the slot over, unless someone else does first.
  return ddp::detail::bytes_to_text(store.compareSet(key, ddp::detail::to_bytes(current), ddp::detail::to_bytes(mine)));
}

// A client first waits, with a real deadline, for the store to accept connections: c10d's own
// connect retries overshoot the timeout about twofold (See Note [Bounded connect to the master] in
// ddp/base/detail/route.h). Throws when nothing accepted a connection within --rdzv_timeout.
inline c10::intrusive_ptr<c10d::TCPStore> open_store(const ddp_rdzv_request& req) {
  const auto timeout = std::chrono::milliseconds(static_cast<long long>(req.timeout_s * 1000));
  if (req.listen_fd < 0 &&
      !ddp::detail::wait_until_listening(req.endpoint_host, req.endpoint_port, std::chrono::steady_clock::now() + timeout)) {
    throw std::runtime_error("nothing accepted a connection there");
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(req.endpoint_port);
  opts.isServer = req.listen_fd >= 0;
  if (opts.isServer) opts.masterListenFd = req.listen_fd;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(req.endpoint_host, opts);
}

// The line of a store that could not be reached.
inline std::string unreachable_store(const ddp_rdzv_request& req, const std::exception& e) {
  return "rendezvous '" + std::string(req.run_id) + "': could not reach the store at " + req.endpoint_host + ":" +
         std::to_string(req.endpoint_port) + " within " + std::to_string(static_cast<int>(req.timeout_s)) +
         " s (--rdzv_timeout); waited for the node that serves it (the one whose address is the endpoint) to "
         "come up: " + one_line(e);
}

}  // namespace ddp::launcher::rdzv_plugin
