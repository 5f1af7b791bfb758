#pragma once
// Joining a job: the join timeout (how long init_process_group waits for the master and for the
// other ranks) and the notices a waiting rank prints. Internal (not installed).
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "ddp/base/worker_variables.h"

namespace ddp::detail {

// Note [Waiting is never silent]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Two ranks started with different MASTER_PORTs used to wait in silence for the full 30 minutes of
// the collective timeout. Joining now has its own bound, the join timeout: torchrun's
// join_timeout, 600 s by default, given to the workers by ddp_launch (--rdzv_conf join_timeout=S
// or --rdzv_timeout S) in DDP_JOIN_TIMEOUT, which a user may also set (seconds) when starting ranks
// by hand; InitOptions::join_timeout wins over both. The collective timeout (InitOptions::timeout,
// 30 min) stays what it was, for collectives and barriers. While a rank waits to join it says so
// every 10 s (InitOptions::wait_notice_interval), on one line: who waits for whom, at which
// address, for how long, out of which timeout, and what to check. A rank other than 0 waits for
// something to accept connections at MASTER_ADDR:MASTER_PORT, then for rank 0's entry in the store;
// rank 0 waits for the entries of the other ranks and names the missing ones.

// The default join timeout (torchrun's join_timeout).
inline constexpr std::chrono::seconds kDefaultJoinTimeout{600};

// DDP_JOIN_TIMEOUT (seconds, > 0) when set, else kDefaultJoinTimeout. Throws ddp::InvalidArgument
// naming the variable when its value is not a positive number.
std::chrono::milliseconds join_timeout_from_environment(const EnvLookup& env);

// Calls attempt(slice) with slices of at most `every` until it returns true (returns true) or
// `timeout` has passed (returns false). After each unsuccessful slice that leaves time, calls
// notice(waited so far). attempt must wait at most `slice`.
bool wait_with_notices(std::chrono::milliseconds timeout, std::chrono::milliseconds every,
                       const std::function<bool(std::chrono::milliseconds slice)>& attempt,
                       const std::function<void(std::chrono::milliseconds waited)>& notice);

// The notice lines of Note [Waiting is never silent]. Pure.
// `address`: where the job meets ("host:port", or the file of a file:// init method).
std::string master_unreachable_notice(int rank, const std::string& address, std::chrono::milliseconds waited,
                                      std::chrono::milliseconds timeout);
std::string waiting_for_rank0_notice(int rank, const std::string& address, std::chrono::milliseconds waited,
                                     std::chrono::milliseconds timeout);
// `missing`: the ranks that have not joined yet (at most the first 16 are named).
std::string waiting_for_ranks_notice(const std::vector<int>& missing, int world_size, const std::string& address,
                                     std::chrono::milliseconds waited, std::chrono::milliseconds timeout);

}  // namespace ddp::detail
