#pragma once
// A program started by `ddp_launch --recovery live` finds its job's membership here: the store
// client and the StoreMembership to pass to ddp::FaultTolerant. See Note [Live recovery with
// ddp_launch] in launcher/agent/live_recovery.cpp.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "ddp/base/worker_variables.h"
#include "ddp/elastic/membership.h"
#include "ddp/distributed/process_group.h"

namespace ddp {

struct LiveJob {
  c10::intrusive_ptr<c10d::Store> store;  // the job's keys in the rendezvous store
  std::shared_ptr<StoreMembership> membership;
  std::string member_id;
  bool joining = false;  // a restarted worker: it receives the state from a survivor
  bool spare = false;    // a hot spare (ddp_launch --spares): FaultTolerant::start() waits in the spare pool
  // The address this host's Gloo transport announces (the kernel's route towards the store's host,
  // See Note [Advertised address] in ddp/base/detail/route.h): FaultTolerantOptions::group.host.
  std::string group_host;
  // Whether the job has workers on other hosts (FaultTolerantOptions::group.spans_hosts: the groups'
  // all-reduces are sliced then, Note [Sliced all-reduce] in ddp/distributed/detail/sliced_allreduce.cpp).
  bool spans_hosts = false;
  // What the job says about its groups (host, spans_hosts), the rest defaulted:
  // FaultTolerantOptions::group, before the program's own settings such as the timeout.
  StoreGroupOptions group_options() const {
    StoreGroupOptions options;
    options.host = group_host;
    options.spans_hosts = spans_hosts;
    return options;
  }
};

// nullopt when the launcher did not start this process with --recovery live (DDP_LIVE_STORE unset).
// Otherwise connects to the store (bounded by `store_timeout`; ddp::TimeoutError naming it) and
// builds the StoreMembership: its first round is the launcher's (RANK, WORLD_SIZE), a restarted
// worker (TORCHELASTIC_RESTART_COUNT > 0) joins the running job. `options` gives the rest
// (settle_timeout); its initial_size, initial_rank and joining are replaced.
std::optional<LiveJob> live_job_from_environment(const EnvLookup& env, StoreMembershipOptions options = {},
                                                 std::chrono::milliseconds store_timeout = std::chrono::seconds(60));

}  // namespace ddp
