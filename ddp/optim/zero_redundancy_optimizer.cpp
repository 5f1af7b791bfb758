#include "ddp/optim/zero_redundancy_optimizer.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "ddp/base/error.h"
#include "ddp/checkpoint/detail/pickle_reader.h"
#include "ddp/checkpoint/detail/state_bytes.h"
#include "ddp/distributed/process_group.h"
#include "ddp/checkpoint/detail/trainer_state.h"

namespace ddp {
namespace optim = torch::optim;

struct ZeroRedundancyOptimizer::Prepared {
  std::vector<optim::OptimizerParamGroup> groups;  // every parameter, options from the local optimizer
  std::unique_ptr<optim::OptimizerOptions> defaults;
  std::unique_ptr<optim::Optimizer> local;
  std::vector<int> owners;
  std::vector<int64_t> local_to_global;
  std::shared_ptr<ProcessGroup> group;
};

// One dtype's parameters, per rank in partition order; flattened into one padded slot per rank.
struct ZeroRedundancyOptimizer::Bucket {
  std::vector<std::vector<torch::Tensor>> params_of_rank;
  int64_t slot = 0;  // the largest rank's element count
};

namespace {

// See Note [ZeroRedundancyOptimizer]: PyTorch's greedy partition.
std::vector<int> partition(const std::vector<optim::OptimizerParamGroup>& groups, int world_size,
                           std::vector<std::vector<int64_t>>& order_of_group) {
  std::vector<int64_t> sizes(static_cast<size_t>(world_size), 0);
  std::vector<int> owners;
  int64_t offset = 0;
  for (const auto& group : groups) {
    const auto& params = group.params();
    std::vector<int64_t> order(params.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return params[a].numel() > params[b].numel(); });
    owners.resize(owners.size() + params.size());
    for (const int64_t i : order) {
      const auto smallest = std::min_element(sizes.begin(), sizes.end());
      *smallest += params[i].numel();
      owners[static_cast<size_t>(offset + i)] = static_cast<int>(smallest - sizes.begin());
    }
    order_of_group.push_back(order);
    offset += static_cast<int64_t>(params.size());
  }
  return owners;
}

}  // namespace

ZeroRedundancyOptimizer::Prepared ZeroRedundancyOptimizer::prepare(std::vector<optim::OptimizerParamGroup> param_groups,
                                                                   const OptimizerFactory& make_local,
                                                                   const std::shared_ptr<ProcessGroup>& group) {
  if (!group) throw InvalidArgument("ZeroRedundancyOptimizer needs a process group");
  if (!make_local) throw InvalidArgument("ZeroRedundancyOptimizer needs a factory of the wrapped optimizer");
  Prepared p;
  p.group = group;
  std::vector<std::vector<int64_t>> order;
  p.owners = partition(param_groups, group->size(), order);
  std::vector<optim::OptimizerParamGroup> local_groups;
  int64_t offset = 0;
  for (size_t g = 0; g < param_groups.size(); ++g) {
    std::vector<torch::Tensor> mine;
    for (const int64_t i : order[g]) {
      if (p.owners[static_cast<size_t>(offset + i)] != group->rank()) continue;
      mine.push_back(param_groups[g].params()[static_cast<size_t>(i)]);
      p.local_to_global.push_back(offset + i);
    }
    local_groups.push_back(param_groups[g].has_options()
                               ? optim::OptimizerParamGroup(mine, param_groups[g].options().clone())
                               : optim::OptimizerParamGroup(mine));
    offset += static_cast<int64_t>(param_groups[g].params().size());
  }
  p.local = make_local(std::move(local_groups));
  if (!p.local || p.local->param_groups().size() != param_groups.size()) {
    throw InvalidArgument("ZeroRedundancyOptimizer: the factory must build an optimizer over the groups it is given");
  }
  for (size_t g = 0; g < param_groups.size(); ++g) {
    p.groups.emplace_back(param_groups[g].params(), p.local->param_groups()[g].options().clone());
  }
  p.defaults = p.local->defaults().clone();
  return p;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::OptimizerParamGroup> param_groups,
                                                 const OptimizerFactory& make_local, std::shared_ptr<ProcessGroup> group)
    : ZeroRedundancyOptimizer(prepare(std::move(param_groups), make_local, group)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(Prepared prepared)
    : Optimizer(prepared.groups, std::move(prepared.defaults)),
      group_(std::move(prepared.group)),
      local_(std::move(prepared.local)),
      owners_(std::move(prepared.owners)),
      local_to_global_(std::move(prepared.local_to_global)) {
  // Buckets by dtype, in order of first appearance (the same on every rank).
  std::vector<torch::ScalarType> dtypes;
  size_t index = 0;
  for (const auto& group : param_groups()) {
    for (const auto& param : group.params()) {
      auto at = std::find(dtypes.begin(), dtypes.end(), param.scalar_type());
      if (at == dtypes.end()) {
        dtypes.push_back(param.scalar_type());
        buckets_.push_back(std::make_shared<Bucket>());
        buckets_.back()->params_of_rank.resize(static_cast<size_t>(group_->size()));
        at = dtypes.end() - 1;
      }
      buckets_[static_cast<size_t>(at - dtypes.begin())]->params_of_rank[static_cast<size_t>(owners_[index++])]
          .push_back(param);
    }
  }
  for (auto& bucket : buckets_) {
    for (const auto& params : bucket->params_of_rank) {
      int64_t numel = 0;
      for (const auto& p : params) numel += p.numel();
      bucket->slot = std::max(bucket->slot, numel);
    }
  }
}

void ZeroRedundancyOptimizer::sync_options() {
  for (size_t g = 0; g < param_groups().size(); ++g) {
    local_->param_groups()[g].set_options(param_groups()[g].options().clone());
  }
}

void ZeroRedundancyOptimizer::take_whole_state() {
  if (state_.empty()) return;
  // See Note [ZeroRedundancyOptimizer]: the shard's entries go to the local optimizer, the rest is dropped.
  for (const auto& group : local_->param_groups()) {
    for (const auto& param : group.params()) {
      auto found = state_.find(param.unsafeGetTensorImpl());
      if (found != state_.end()) local_->state()[param.unsafeGetTensorImpl()] = std::move(found->second);
    }
  }
  state_.clear();
}

void ZeroRedundancyOptimizer::gather_parameters() {
  if (group_->size() == 1) return;
  torch::NoGradGuard no_grad;
  for (const auto& bucket : buckets_) {
    const auto& mine = bucket->params_of_rank[static_cast<size_t>(group_->rank())];
    torch::TensorOptions options;
    for (const auto& params : bucket->params_of_rank) {
      if (!params.empty()) options = params.front().options();
    }
    torch::Tensor slot = torch::zeros({bucket->slot}, options);
    int64_t at = 0;
    for (const auto& p : mine) {
      slot.narrow(0, at, p.numel()).copy_(p.detach().reshape(-1));
      at += p.numel();
    }
    const std::vector<torch::Tensor> slots = group_->allgather(slot, "ZeRO parameter all-gather");
    for (int r = 0; r < group_->size(); ++r) {
      if (r == group_->rank()) continue;
      at = 0;
      for (const auto& p : bucket->params_of_rank[static_cast<size_t>(r)]) {
        p.detach().copy_(slots[static_cast<size_t>(r)].narrow(0, at, p.numel()).view(p.sizes()));
        at += p.numel();
      }
    }
  }
}

torch::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  take_whole_state();
  sync_options();
  torch::Tensor loss = local_->step(std::move(closure));
  gather_parameters();
  return loss;
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  if (to < 0 || to >= group_->size()) {
    throw InvalidArgument(str("consolidate_state_dict: rank ", to, " is not in the group of ", group_->size()));
  }
  take_whole_state();  // a loaded state not stepped yet: the local optimizer holds the shard
  sync_options();
  // Note [ZeRO state on the wire]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // Each rank's shard travels as the live state's bytes (detail::StateWriter, Note [Live state on the
  // wire]): its count of entries, then each entry's global index and its fields. Plain data only:
  // nothing is unpickled, so a peer's bytes cannot run code.
  const auto local = detail::optimizer_state_dict(*local_).toGenericDict().at("state").toGenericDict();
  detail::StateWriter mine;
  mine.integer(static_cast<int64_t>(local.size()));
  for (const auto& entry : local) {
    mine.integer(local_to_global_.at(static_cast<size_t>(entry.key().toInt())));
    mine.value(entry.value());
  }
  auto state = detail::PickleValue::of(detail::PickleValue::Kind::kDict);
  for (int r = 0; r < group_->size(); ++r) {
    std::string bytes = r == group_->rank() ? mine.bytes() : std::string();
    group_->broadcast_bytes(bytes, r, "ZeRO consolidate_state_dict");
    if (group_->rank() != to) continue;
    detail::StateReader in(bytes, str("ZeroRedundancyOptimizer: rank ", r, "'s state"));
    for (int64_t count = in.integer(); count > 0; --count) {
      auto global = detail::PickleValue::of(detail::PickleValue::Kind::kInteger);
      global.integer = in.integer();
      state.entries->emplace_back(std::move(global), in.value());
    }
    if (!in.at_end()) in.fail("bytes after the last entry");
  }
  if (group_->rank() != to) return;
  // The whole state in Python's layout, read into this wrapper's state() as a checkpoint would be: the
  // param groups from this wrapper (through the same bytes, as the reader's tree), the state from the ranks.
  consolidating_ = true;
  detail::StateWriter groups;
  groups.value(detail::optimizer_state_dict(*this));
  consolidating_ = false;
  detail::PickleValue whole = detail::StateReader(groups.bytes(), "ZeroRedundancyOptimizer's param groups").value();
  for (auto& [key, value] : *whole.entries) {
    if (key.text == "state") value = state;
  }
  const torch::Device device = param_groups().empty() || param_groups()[0].params().empty()
                                   ? torch::Device(torch::kCPU)
                                   : param_groups()[0].params()[0].device();
  detail::load_optimizer_state_dict(*this, whole, device, "ZeroRedundancyOptimizer consolidated state");
}

void ZeroRedundancyOptimizer::check_state_is_whole() const {
  if (consolidating_ || !state_.empty() || local_->state().empty()) return;
  throw InvalidArgument(
      "ZeroRedundancyOptimizer: the state is sharded; call consolidate_state_dict(to) on every rank before "
      "saving it on rank `to`");
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const { return optimizer_state_bytes(*local_); }

int64_t optimizer_state_bytes(const optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  const c10::IValue dict = detail::optimizer_state_dict(optimizer);
  for (const auto& entry : dict.toGenericDict().at("state").toGenericDict()) {
    for (const auto& field : entry.value().toGenericDict()) {
      if (field.value().isTensor()) bytes += static_cast<int64_t>(field.value().toTensor().nbytes());
    }
  }
  return bytes;
}

}  // namespace ddp
