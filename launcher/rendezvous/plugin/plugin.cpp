// The rendezvous plugin: node ranks from c10d's TCPStore. Built as libddp_launch_rdzv.so.
// Note [Dynamic rendezvous]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// - Serving: the node that can bind the endpoint's address and port serves the store; ddp_launch
//   binds that socket itself, to exactly the endpoint's address (a loopback endpoint listens on
//   loopback only), and the store takes it over (TCPStoreOptions::masterListenFd). Whoever loses
//   the bind (two launchers on one host) is a client. So the endpoint must be an address of one of
//   the job's nodes, as with torchrun's c10d backend. An endpoint named by the serving host's own
//   Debian name (127.0.1.1 there, its network address elsewhere) listens on every interface, and
//   the address published below is never a loopback one while nnodes > 1 (See Note [Advertised
//   address] in ddp/base/detail/route.h; launcher/rendezvous/store_client.cpp chooses both).
// - Node ranks: slots claimed with compareSet, each claim proved with the job's token; nothing a
//   foreign client writes counts as a join (See Note [Rendezvous token] in rdzv_records.cpp). A node
//   that finds every slot held by a launcher of this job is refused.
// - Master: the node that gets rank 0 publishes "<addr> <port>" (its address towards the endpoint,
//   by the kernel's route lookup, and a free port on it), proved likewise; every node waits until nnodes have joined, then reads
//   it. Everything is bounded by --rdzv_timeout, and a timeout says how many nodes had joined.
// - Lifetime: the serving node keeps the store until every node has marked itself done (each mark
//   proved, bounded by the timeout), so nobody reads from a store that is gone.
// - Elastic jobs (--nnodes MIN:MAX) use the same store in rounds: rdzv_plugin_rounds.cpp, See
//   Note [Elastic rounds] in launcher/rendezvous/rounds.cpp.
// - Errors: one line each. c10d's exceptions carry a backtrace in what(); only the first line of
//   what_without_backtrace() is reported. c10d also logs a failed store operation as a warning with
//   a 17-line backtrace before it throws; unless the user asked for c10's logs (TORCH_CPP_LOG_LEVEL),
//   the launcher's process keeps only c10's fatal ones (FLAGS_caffe2_log_level, c10/util/Logging.h;
//   the workers are other processes and keep theirs).
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "ddp/base/detail/store_values.h"
#include "ddp/base/str.h"
#include "launcher/rendezvous/plugin/plugin_api.h"
#include "launcher/rendezvous/plugin/plugin_store.h"
#include "launcher/rendezvous/records.h"

namespace {

namespace rdzv = ddp::launcher::rdzv;
using Clock = std::chrono::steady_clock;
using ddp::detail::bytes_to_text;
using ddp::detail::to_bytes;

using ddp::launcher::rdzv_plugin::claim;
using ddp::launcher::rdzv_plugin::Handle;
using ddp::launcher::rdzv_plugin::one_line;
using ddp::launcher::rdzv_plugin::open_store;
using ddp::launcher::rdzv_plugin::try_get;

void set_error(ddp_rdzv_result* r, const std::string& text) {
  ddp::launcher::rdzv_plugin::set_error(r->error, sizeof r->error, text);
}

class Join {
 public:
  Join(const ddp_rdzv_request& req, Handle& handle)
      : req_(req),
        store_(*handle.store),
        token_(req.token),
        id_(req.run_id),
        where_(std::string(req.endpoint_host) + ":" + std::to_string(req.endpoint_port)),
        nonce_(rdzv::random_nonce()),
        deadline_(Clock::now() + std::chrono::milliseconds(static_cast<long long>(req.timeout_s * 1000))) {}

  // Fills result; returns false with result->error set.
  bool run(ddp_rdzv_result* result) {
    const int rank = take_slot(result);
    if (rank < 0) return false;
    result->node_rank = rank;
    if (!wait_for_all(rank, result)) return false;
    const std::optional<rdzv::MasterRecord> master = read_master(result);
    if (!master) return false;
    std::snprintf(result->master_addr, sizeof result->master_addr, "%s", master->addr.c_str());
    result->master_port = master->port;
    store_.set(rdzv::done_key(id_) + "/" + std::to_string(rank), to_bytes(my_claim(rank)));
    return true;
  }

 private:
  std::string my_claim(int slot) const { return rdzv::make_claim(token_, id_, req_.nnodes, slot, nonce_); }
  bool is_valid(int slot, const std::string& value) const {
    const bool valid = rdzv::is_valid_claim(token_, id_, req_.nnodes, slot, value);
    if (!valid && value.rfind("claim ", 0) == 0) saw_unproved_claim_ = true;
    return valid;
  }
  // What a timeout adds when a claim that looked like a launcher's did not verify.
  std::string token_hint() const {
    return saw_unproved_claim_ ? " (a claim in the store did not verify: does every launcher have the same "
                                 "DDP_RDZV_TOKEN?)"
                               : "";
  }
  std::string prefix() const { return "rendezvous '" + id_ + "' at " + where_; }
  bool timed_out() const { return Clock::now() >= deadline_; }
  static void pause() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

  // The first slot this node can claim; -1 (error set) when every slot is a launcher's, or on timeout.
  int take_slot(ddp_rdzv_result* result) {
    while (true) {
      bool all_taken = true;
      for (int slot = 0; slot < req_.nnodes; ++slot) {
        const std::string mine = my_claim(slot);
        const std::string now = claim(store_, rdzv::slot_key(id_, slot), mine,
                                      [&](const std::string& v) { return is_valid(slot, v); });
        if (now == mine) return slot;
        all_taken = all_taken && is_valid(slot, now);
      }
      if (all_taken) {
        set_error(result, prefix() + " already has all " + std::to_string(req_.nnodes) +
                              " nodes: this node is one too many (same --rdzv_id reused, or --nnodes differs "
                              "between nodes?)");
        return -1;
      }
      if (timed_out()) {
        set_error(result, prefix() + " timed out after " + std::to_string(static_cast<int>(req_.timeout_s)) +
                              " s (--rdzv_timeout) before this node could take a node rank" + token_hint());
        return -1;
      }
      pause();
    }
  }

  // Waits until every slot holds a launcher's claim. Meanwhile this node puts back its own claim
  // (and rank 0 the master record) when a foreign write replaced them.
  bool wait_for_all(int rank, ddp_rdzv_result* result) {
    const std::string master_record =
        rdzv::make_master_record(token_, id_, {req_.advertise_addr, req_.advertise_port});
    while (true) {
      if (rank == 0) {
        const std::optional<std::string> current = try_get(store_, rdzv::master_key(id_));
        if (current != master_record) store_.set(rdzv::master_key(id_), to_bytes(master_record));
      }
      int joined = 0;
      for (int slot = 0; slot < req_.nnodes; ++slot) {
        std::optional<std::string> value = try_get(store_, rdzv::slot_key(id_, slot));
        if (slot == rank && value != my_claim(slot)) {
          if (value && is_valid(slot, *value)) {
            set_error(result, prefix() + ": another launcher took this node's rank " + std::to_string(rank) +
                                  " after a foreign client overwrote it; start the job again");
            return false;
          }
          value = claim(store_, rdzv::slot_key(id_, slot), my_claim(slot),
                        [&](const std::string& v) { return is_valid(slot, v); });
        }
        if (value && is_valid(slot, *value)) ++joined;
      }
      result->nodes_joined = joined;
      if (joined >= req_.nnodes) return true;
      if (timed_out()) {
        set_error(result, prefix() + " timed out after " + std::to_string(static_cast<int>(req_.timeout_s)) +
                              " s (--rdzv_timeout): " + std::to_string(joined) + " of " +
                              std::to_string(req_.nnodes) + " nodes joined; waited for the other " +
                              std::to_string(req_.nnodes - joined) + token_hint());
        // Leave, so a retry with the same id can still complete.
        store_.compareSet(rdzv::slot_key(id_, rank), to_bytes(my_claim(rank)), to_bytes("left"));
        return false;
      }
      pause();
    }
  }

  std::optional<rdzv::MasterRecord> read_master(ddp_rdzv_result* result) {
    std::string problem;
    while (true) {
      if (const auto value = try_get(store_, rdzv::master_key(id_))) {
        if (auto master = rdzv::parse_master_record(token_, id_, *value, problem)) return master;
      } else {
        problem = "key '" + rdzv::master_key(id_) + "' is missing";
      }
      if (timed_out()) {
        set_error(result, prefix() + ": " + problem);
        return std::nullopt;
      }
      pause();
    }
  }

  const ddp_rdzv_request& req_;
  c10d::TCPStore& store_;
  rdzv::Token token_;
  std::string id_;
  std::string where_;
  std::string nonce_;
  Clock::time_point deadline_;
  mutable bool saw_unproved_claim_ = false;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) void* ddp_rdzv_join(const ddp_rdzv_request* req,
                                                                      ddp_rdzv_result* result) {
  std::memset(result, 0, sizeof *result);
  if (req->quiet_c10_logs != 0) FLAGS_caffe2_log_level = 3;  // FATAL only: see Note [Dynamic rendezvous]
  const std::string where = std::string(req->endpoint_host) + ":" + std::to_string(req->endpoint_port);
  const std::string id = req->run_id;
  auto handle = std::make_unique<Handle>();
  handle->run_id = id;
  handle->token = req->token;
  handle->nnodes = req->nnodes;
  handle->timeout_s = req->timeout_s;
  handle->is_server = req->listen_fd >= 0;
  handle->where = where;
  try {
    handle->store = open_store(*req);
  } catch (const std::exception& e) {
    set_error(result, ddp::launcher::rdzv_plugin::unreachable_store(*req, e));
    return nullptr;
  }
  try {
    Join join(*req, *handle);
    if (!join.run(result)) return nullptr;
  } catch (const std::exception& e) {
    set_error(result, "rendezvous '" + id + "' at " + where + " failed: " + one_line(e));
    return nullptr;
  }
  return handle.release();
}

extern "C" __attribute__((visibility("default"))) void ddp_rdzv_release(void* opaque) {
  std::unique_ptr<Handle> handle(static_cast<Handle*>(opaque));
  if (!handle || !handle->is_server) return;
  const rdzv::Token token(handle->token);
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<long long>(handle->timeout_s * 1000));
  try {
    for (int slot = 0; slot < handle->nnodes && Clock::now() < deadline; ++slot) {
      const std::string key = rdzv::done_key(handle->run_id) + "/" + std::to_string(slot);
      while (Clock::now() < deadline) {
        const auto value = try_get(*handle->store, key);
        if (value && rdzv::is_valid_claim(token, handle->run_id, handle->nnodes, slot, *value)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } catch (const std::exception&) {
    // The store is going away either way.
  }
}

extern "C" __attribute__((visibility("default"))) int ddp_rdzv_publish(void* opaque, const char* name,
                                                                       const char* addr, int port,
                                                                       ddp_rdzv_endpoint* out) {
  std::memset(out, 0, sizeof *out);
  auto& handle = *static_cast<Handle*>(opaque);
  const std::string id = rdzv::endpoint_id(handle.run_id, name);
  try {
    handle.store->set(rdzv::master_key(id),
                      to_bytes(rdzv::make_master_record(rdzv::Token(handle.token), id, {addr, port})));
    return 0;
  } catch (const std::exception& e) {
    ddp::launcher::rdzv_plugin::set_error(out->error, sizeof out->error,
                                          "rendezvous '" + handle.run_id + "' at " + handle.where +
                                              ": could not publish " + name + ": " + one_line(e));
    return -1;
  }
}

extern "C" __attribute__((visibility("default"))) int ddp_rdzv_lookup(void* opaque, const char* name,
                                                                      double timeout_s, ddp_rdzv_endpoint* out) {
  std::memset(out, 0, sizeof *out);
  auto& handle = *static_cast<Handle*>(opaque);
  const rdzv::Token token(handle.token);
  const std::string id = rdzv::endpoint_id(handle.run_id, name);
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  std::string problem = "nothing was published there";
  try {
    while (true) {
      if (const auto value = try_get(*handle.store, rdzv::master_key(id))) {
        if (auto endpoint = rdzv::parse_master_record(token, id, *value, problem)) {
          std::snprintf(out->addr, sizeof out->addr, "%s", endpoint->addr.c_str());
          out->port = endpoint->port;
          return 0;
        }
      }
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception& e) {
    problem = one_line(e);
  }
  ddp::launcher::rdzv_plugin::set_error(out->error, sizeof out->error,
                                        "rendezvous '" + handle.run_id + "' at " + handle.where + ": no " + name +
                                            " within " + std::to_string(static_cast<int>(timeout_s)) +
                                            " s (--rdzv_timeout): " + problem);
  return -1;
}
