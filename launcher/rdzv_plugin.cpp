// The rendezvous plugin: node ranks from c10d's TCPStore. Built as libddp_launch_rdzv.so.
// Note [Dynamic rendezvous]
// - Serving: the node that can bind the endpoint's address and port serves the store (ddp_launch
//   probes that before calling us); if two nodes of one host race for it, the loser becomes a client.
//   So the endpoint must be an address of one of the job's nodes, as with torchrun's c10d backend.
// - Node ranks: each node does add("ddp_rdzv/<id>/joined", 1); the value it gets back, minus one, is
//   its node rank (arrival order). A node that arrives after nnodes have joined is refused.
// - Master: the node that gets rank 0 publishes "<addr> <port>" (its address towards the endpoint
//   and a free port on it) under ".../master"; every node waits until nnodes have joined, then reads
//   it. Everything is bounded by --rdzv_timeout, and a timeout says how many nodes had joined.
// - Lifetime: the serving node keeps the store until every node has counted itself in ".../done"
//   (bounded), so nobody reads from a store that is gone.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "launcher/rdzv_plugin_api.h"

namespace {

struct Handle {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string prefix;
  int nnodes = 0;
  bool is_server = false;
  double timeout_s = 0;
};

void set_error(ddp_rdzv_result* r, const std::string& text) {
  std::snprintf(r->error, sizeof r->error, "%s", text.c_str());
}

std::string to_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

c10::intrusive_ptr<c10d::TCPStore> open_store(const ddp_rdzv_request& req, bool server) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(req.endpoint_port);
  opts.isServer = server;
  opts.waitWorkers = false;
  opts.timeout = std::chrono::milliseconds(static_cast<long long>(req.timeout_s * 1000));
  return c10::make_intrusive<c10d::TCPStore>(req.endpoint_host, opts);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void* ddp_rdzv_join(const ddp_rdzv_request* req,
                                                                      ddp_rdzv_result* result) {
  std::memset(result, 0, sizeof *result);
  const std::string where = std::string(req->endpoint_host) + ":" + std::to_string(req->endpoint_port);
  const std::string id = req->run_id;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long long>(req->timeout_s * 1000));
  auto handle = std::make_unique<Handle>();
  handle->prefix = "ddp_rdzv/" + id + "/";
  handle->nnodes = req->nnodes;
  handle->timeout_s = req->timeout_s;
  try {
    bool server = req->is_server != 0;
    try {
      handle->store = open_store(*req, server);
    } catch (const std::exception&) {
      if (!server) throw;
      server = false;  // another launcher on this host bound the port first
      handle->store = open_store(*req, false);
    }
    handle->is_server = server;
  } catch (const std::exception&) {
    set_error(result, "rendezvous '" + id + "': could not reach the store at " + where + " within " +
                          std::to_string(static_cast<int>(req->timeout_s)) +
                          " s (--rdzv_timeout); waited for the node that serves it (the one whose address is "
                          "the endpoint) to come up");
    return nullptr;
  }
  auto& store = *handle->store;
  const std::string& p = handle->prefix;
  try {
    const int64_t arrival = store.add(p + "joined", 1);
    if (arrival > req->nnodes) {
      store.add(p + "joined", -1);
      set_error(result, "rendezvous '" + id + "' at " + where + " already has all " +
                            std::to_string(req->nnodes) + " nodes: this node is one too many (same --rdzv_id reused, "
                            "or --nnodes differs between nodes?)");
      return nullptr;
    }
    result->node_rank = static_cast<int>(arrival - 1);
    if (result->node_rank == 0) {
      const std::string master = std::string(req->advertise_addr) + " " + std::to_string(req->advertise_port);
      store.set(p + "master", std::vector<uint8_t>(master.begin(), master.end()));
    }
    int64_t joined = arrival;
    while (joined < req->nnodes) {
      if (std::chrono::steady_clock::now() >= deadline) {
        result->nodes_joined = static_cast<int>(joined);
        set_error(result, "rendezvous '" + id + "' at " + where + " timed out after " +
                              std::to_string(static_cast<int>(req->timeout_s)) + " s (--rdzv_timeout): " +
                              std::to_string(joined) + " of " + std::to_string(req->nnodes) +
                              " nodes joined; waited for the other " + std::to_string(req->nnodes - joined));
        store.add(p + "joined", -1);  // leave, so a retry with the same id can still complete
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      joined = store.add(p + "joined", 0);
    }
    result->nodes_joined = static_cast<int>(joined);
    const std::string master = to_string(store.get(p + "master"));
    const auto space = master.rfind(' ');
    std::snprintf(result->master_addr, sizeof result->master_addr, "%s", master.substr(0, space).c_str());
    result->master_port = std::stoi(master.substr(space + 1));
    store.add(p + "done", 1);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    set_error(result, "rendezvous '" + id + "' at " + where + " failed: " + what);
    return nullptr;
  }
  return handle.release();
}

extern "C" __attribute__((visibility("default"))) void ddp_rdzv_release(void* opaque) {
  std::unique_ptr<Handle> handle(static_cast<Handle*>(opaque));
  if (!handle || !handle->is_server) return;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long long>(handle->timeout_s * 1000));
  try {
    while (handle->store->add(handle->prefix + "done", 0) < handle->nnodes &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
    // The store is going away either way.
  }
}
