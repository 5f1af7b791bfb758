#include "ddp/distributed/detail/join_wait.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/error.h"

namespace ddp::detail {
namespace {

using std::chrono::milliseconds;

std::string seconds_text(milliseconds ms) {
  const double s = static_cast<double>(ms.count()) / 1000.0;
  return s == std::floor(s) ? str(static_cast<long long>(s), " s") : str(s, " s");
}

std::string timeout_text(milliseconds timeout) {
  return str("join timeout ", seconds_text(timeout), ": ddp_launch --rdzv_conf join_timeout=S or ",
             env::kJoinTimeout, "=S");
}

}  // namespace

milliseconds join_timeout_from_environment(const EnvLookup& env) {
  const auto text = env(env::kJoinTimeout);
  if (!text || text->empty()) return kDefaultJoinTimeout;
  char* end = nullptr;
  const double seconds = std::strtod(text->c_str(), &end);
  if (end == text->c_str() || *end != '\0' || !(seconds > 0) || seconds > 1e9) {
    throw InvalidArgument(str(env::kJoinTimeout, "='", *text,
                              "' is not a positive number of seconds (how long a rank waits to join the job)"));
  }
  return milliseconds(static_cast<long long>(std::ceil(seconds * 1000.0)));
}

bool wait_with_notices(milliseconds timeout, milliseconds every,
                       const std::function<bool(milliseconds slice)>& attempt,
                       const std::function<void(milliseconds waited)>& notice) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  every = std::max(every, milliseconds(1));
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (attempt(std::clamp(left, milliseconds(1), every))) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    notice(std::chrono::duration_cast<milliseconds>(now - start));
  }
}

std::string master_unreachable_notice(int rank, const std::string& address, milliseconds waited,
                                      milliseconds timeout) {
  return str("rank ", rank, " has waited ", seconds_text(waited), " for the master (rank 0) at ", address,
             ": nothing accepts connections there yet (", timeout_text(timeout),
             "). Check that rank 0 is running and that every rank has the same MASTER_ADDR and MASTER_PORT");
}

std::string waiting_for_rank0_notice(int rank, const std::string& address, milliseconds waited,
                                     milliseconds timeout) {
  return str("rank ", rank, " has waited ", seconds_text(waited), " for rank 0 to join at ", address, " (",
             timeout_text(timeout), "). Check that rank 0 is running and that this address is not another job's");
}

std::string waiting_for_ranks_notice(const std::vector<int>& missing, int world_size, const std::string& address,
                                     milliseconds waited, milliseconds timeout) {
  constexpr std::size_t kNamed = 16;
  const std::vector<int> named(missing.begin(), missing.begin() + static_cast<long>(std::min(missing.size(), kNamed)));
  std::string ranks = join(named, ", ");
  if (missing.size() > kNamed) ranks += str(" and ", missing.size() - kNamed, " more");
  return str("rank 0 (the master, at ", address, ") has waited ", seconds_text(waited), " for ",
             missing.size() == 1 ? "rank " : "ranks ", ranks, " of ", world_size, " to join (", timeout_text(timeout),
             "). Start ", missing.size() == 1 ? "it" : "them", ", or check that every rank has this address (",
             "MASTER_ADDR, MASTER_PORT) and WORLD_SIZE=", world_size);
}

}  // namespace ddp::detail
