#include "ddp/elastic/live_job.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ddp/base/worker_variable_names.h"
#include "ddp/base/error.h"
#include "ddp/base/detail/route.h"
#include "ddp/base/detail/store_values.h"
#include "ddp/base/str.h"

namespace ddp {

std::optional<LiveJob> live_job_from_environment(const EnvLookup& env, StoreMembershipOptions options,
                                                 std::chrono::milliseconds store_timeout) {
  const std::optional<LiveRecoveryEnvironment> live = parse_live_recovery_environment(env);
  if (!live) return std::nullopt;
  const WorkerEnvironment worker = parse_worker_environment(env);
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(live->store_port);
  store_options.isServer = false;
  store_options.waitWorkers = false;
  store_options.timeout = store_timeout;
  const auto unreachable = [&](const std::string& why) {
    return TimeoutError(str("live recovery: could not reach the job's store ", live->store_host, ":", live->store_port,
                            " within ", detail::seconds_of(store_timeout), " s: ", why));
  };
  // See Note [Bounded connect to the master] in ddp/base/detail/route.h: c10d's connect overshoots.
  if (!detail::wait_until_listening(live->store_host, live->store_port, std::chrono::steady_clock::now() + store_timeout)) {
    throw unreachable("nothing accepted a connection there (is the launcher of the store's host running?)");
  }
  c10::intrusive_ptr<c10d::Store> client;
  try {
    client = c10::make_intrusive<c10d::TCPStore>(live->store_host, store_options);
  } catch (const std::exception& e) {
    throw unreachable(first_line(e.what()));
  }
  LiveJob job;
  job.store = c10::make_intrusive<c10d::PrefixStore>(live->prefix, client);
  job.member_id = live->member_id;
  job.joining = worker.restart_count > 0;
  job.spare = live->spare;
  detail::AdvertiseOptions advertise;
  advertise.peers_on_other_hosts = worker.local_world_size < worker.world_size;
  advertise.socket_ifname = env(env::kGlooSocketIfname);
  advertise.master_name = env::kLiveStore;
  const detail::RouteFacts route = detail::look_up_route(live->store_host);
  const detail::AdvertisedAddress advertised = detail::choose_advertised_address(route, advertise);
  job.spans_hosts = advertise.peers_on_other_hosts;
  job.group_host = !advertised.address.empty() ? advertised.address : route.route_source.value_or("127.0.0.1");
  options.initial_size = worker.world_size;
  options.initial_rank = worker.rank;
  options.joining = job.joining;
  options.spare = job.spare;
  job.membership = std::make_shared<StoreMembership>(job.store, job.member_id, options);
  return job;
}

}  // namespace ddp
