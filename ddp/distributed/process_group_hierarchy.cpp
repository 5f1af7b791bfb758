// ddp::ProcessGroup's topology, its sub-groups and the collectives they use (see Note
// [Hierarchical collectives] in ddp/distributed/hierarchical_collectives.h); the rest of the group is in
// process_group.cpp.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>

#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "ddp/runtime/detail/cuda_support.h"
#include "ddp/distributed/hierarchical_collectives.h"
#include "ddp/distributed/detail/process_group_state.h"
#include "ddp/distributed/process_group.h"

namespace ddp {
namespace {

bool associative(c10d::ReduceOp op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::PRODUCT:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      return true;
    default:
      return false;
  }
}

}  // namespace

int ProcessGroup::global_rank(int rank) const {
  return state_->info.global_ranks.empty() ? rank : state_->info.global_ranks.at(static_cast<std::size_t>(rank));
}

std::optional<std::string> ProcessGroup::write_collectives_dump(const std::string& reason) const {
  if (state_->info.log_dir.empty()) return std::nullopt;
  detail::CollectiveDumpHeader header;
  header.rank = state_->info.rank;
  header.world_size = state_->info.size;
  header.backend = state_->info.backend_name;
  header.reason = reason;
  header.last_seq = state_->collectives.last_seq();
  header.capacity = state_->collectives.capacity();
  return detail::write_collectives_file(state_->info.log_dir, state_->info.rank, detail::collectives_json(header, state_->collectives.snapshot()));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_scatter_tensor_async(torch::Tensor& output,
                                                                       const torch::Tensor& input,
                                                                       c10d::ReduceOp op, const char* what) {
  c10d::ReduceScatterOptions options;
  options.reduceOp = op;
  auto in = input;
  const auto seq = begin_collective("reduce_scatter", what, -1, &in);
  return start_collective(seq, what, [&] { return backend()->_reduce_scatter_base(output, in, options); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allgather_into_tensor_async(torch::Tensor& output,
                                                                       const torch::Tensor& input, const char* what) {
  auto in = input;
  const auto seq = begin_collective("allgather", what, -1, &in);
  return start_collective(seq, what, [&] { return backend()->_allgather_base(output, in); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_async(torch::Tensor& tensor, c10d::ReduceOp op,
                                                           const char* what) {
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  const auto seq = begin_collective("allreduce", what, -1, &tensor);
  return start_collective(seq, what, [&] { return start_flat_allreduce(tensor, options); });
}

void ProcessGroup::reduce_scatter_tensor(torch::Tensor& output, const torch::Tensor& input, c10d::ReduceOp op,
                                         const char* what) {
  wait(reduce_scatter_tensor_async(output, input, op, what), what);
}

void ProcessGroup::allgather_into_tensor(torch::Tensor& output, const torch::Tensor& input, const char* what) {
  wait(allgather_into_tensor_async(output, input, what), what);
}

std::string ProcessGroup::algorithm_choice() const {
  std::lock_guard<std::mutex> lock(state_->hierarchy_mutex);
  return state_->algorithm_choice;
}

HierarchicalCollectives* ProcessGroup::hierarchical_for(const torch::Tensor& tensor, std::optional<c10d::ReduceOp> op) {
  if (state_->algorithm == CollectiveAlgorithm::kFlat || state_->info.size == 1 || !state_->info.global_ranks.empty()) return nullptr;
  if (!tensor.defined() || !tensor.device().is_cpu() || state_->info.backend_name != "gloo") return nullptr;
  if (op && !associative(*op)) return nullptr;
  HierarchicalCollectives* hierarchical = hierarchy();
  if (hierarchical == nullptr) return nullptr;
  const std::int64_t bytes = tensor.numel() * static_cast<std::int64_t>(tensor.element_size());
  if (state_->algorithm == CollectiveAlgorithm::kAuto && bytes < HierarchicalCollectives::kAutoMinBytes) return nullptr;
  return hierarchical;
}

Topology ProcessGroup::resolve_topology() {
  // See Note [Host topology] in ddp/distributed/topology.h.
  if (state_->info.host_identity.empty() && state_->info.local_size == state_->info.size) return single_host_topology(state_->info.size);
  const std::string identity = state_->info.host_identity.empty() ? this_host_identity() : state_->info.host_identity;
  const auto store = c10::make_intrusive<c10d::PrefixStore>("ddp/hierarchy/identity", state_->store);
  std::vector<std::string> keys;
  for (int r = 0; r < state_->info.size; ++r) keys.push_back(std::to_string(r));
  std::vector<std::string> identities;
  try {
    store->set(keys[static_cast<std::size_t>(state_->info.rank)], std::vector<uint8_t>(identity.begin(), identity.end()));
    store->wait(keys, state_->info.timeout);
    for (const auto& key : keys) {
      const auto bytes = store->get(key);
      identities.emplace_back(bytes.begin(), bytes.end());
    }
  } catch (const std::exception& error) {
    throw TimeoutError(str("rank ", state_->info.rank, " could not learn the hosts of the other ranks within ",
                           state_->info.timeout.count() / 1000.0, " s (every rank publishes its host at its first "
                           "collective over CPU tensors): ", first_line(error.what())));
  }
  return topology_from_identities(identities);
}

// Note [Sub-groups share the devices]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The sub-groups are Gloo groups over the parent's own transport devices: the interfaces of
// GLOO_SOCKET_IFNAME, or the advertised address (Note [Advertised address] in ddp/base/detail/route.h), so
// the groups across hosts bind and announce exactly what the parent does and reach the same peers.
// Two ranks of one host connect to their host's own address, which Linux carries over loopback.
std::shared_ptr<ProcessGroup> ProcessGroup::make_sub_group(const std::string& name, const std::vector<int>& ranks,
                                                           const std::string& store_prefix, bool spans_hosts) {
  auto* gloo = dynamic_cast<c10d::ProcessGroupGloo*>(backend().get());
  if (gloo == nullptr) throw Error("hierarchical collectives need the Gloo backend");
  Info sub;
  sub.rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), state_->info.rank) - ranks.begin());
  sub.size = static_cast<int>(ranks.size());
  sub.local_rank = sub.rank;
  sub.local_size = sub.size;
  sub.backend_name = "gloo";
  sub.timeout = state_->info.timeout;
  sub.allreduce_slice_bytes = state_->info.allreduce_slice_bytes;
  sub.spans_hosts = spans_hosts;
  sub.group_name = str(name, " (ranks ", join(ranks, ", "), ")");
  sub.global_ranks = ranks;
  auto options = c10d::ProcessGroupGloo::Options::create(state_->info.timeout);
  options->devices = gloo->getOptions()->devices;
  auto store = c10::make_intrusive<c10d::PrefixStore>(store_prefix, state_->store);
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, sub.rank, sub.size, options);
  } catch (const std::exception& error) {
    throw CommunicationError(str("rank ", state_->info.rank, " could not set up the sub-group ", sub.group_name,
                                 " within ", state_->info.timeout.count() / 1000.0, " s: ", first_line(error.what())));
  }
  auto group = std::make_shared<ProcessGroup>(std::move(sub), std::move(store), std::move(backend));
  group->set_collective_algorithm(CollectiveAlgorithm::kFlat);
  return group;
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group_of_same_ranks(const std::string& name,
                                                                    const std::string& store_prefix) {
  std::vector<int> ranks(static_cast<std::size_t>(state_->info.size));
  for (int r = 0; r < state_->info.size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  return make_sub_group(name, ranks, store_prefix, state_->info.spans_hosts);
}

HierarchicalCollectives* ProcessGroup::hierarchy() {
  std::lock_guard<std::mutex> lock(state_->hierarchy_mutex);
  if (state_->hierarchy_resolved) return state_->hierarchy.get();
  state_->hierarchy_resolved = true;
  const bool flat_wanted = state_->algorithm == CollectiveAlgorithm::kFlat || !state_->info.global_ranks.empty() ||
                           state_->info.backend_name != "gloo";
  Topology topology = flat_wanted ? single_host_topology(state_->info.size) : resolve_topology();
  const AlgorithmChoice choice = flat_wanted ? AlgorithmChoice{false, "flat"} : choose_algorithm(state_->algorithm, topology);
  state_->algorithm_choice = choice.reason;
  state_->logger.log(state_->info.rank == 0 && state_->info.global_ranks.empty() ? LogLevel::kInfo : LogLevel::kDebug,
                     str("collectives over CPU tensors: ", choice.reason));
  if (!choice.hierarchical) return nullptr;
  const int host = topology.host_of_rank[static_cast<std::size_t>(state_->info.rank)];
  const int local_rank = topology.local_rank_of_rank[static_cast<std::size_t>(state_->info.rank)];
  auto intra = make_sub_group(str("host ", host), topology.ranks_of_host[static_cast<std::size_t>(host)],
                              str("ddp/hierarchy/host/", host), /*spans_hosts=*/false);
  auto inter = make_sub_group(str("local rank ", local_rank, " across hosts"), topology.ranks_with_local_rank(local_rank),
                              str("ddp/hierarchy/local_rank/", local_rank), /*spans_hosts=*/true);
  state_->hierarchy = std::make_unique<HierarchicalCollectives>(std::move(topology), state_->info.rank, std::move(intra),
                                                         std::move(inter), state_->info.timeout);
  return state_->hierarchy.get();
}

}  // namespace ddp
