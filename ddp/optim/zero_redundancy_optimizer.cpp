#include "ddp/optim/zero_redundancy_optimizer.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <sstream>
#include <string>

#include "ddp/base/error.h"
#include "ddp/checkpoint/detail/pickle_reader.h"
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

// c10 IValue (optimizer_state_dict's output) as the safe reader's tree, for load_optimizer_state_dict.
detail::PickleValue to_pickle(const c10::IValue& value) {
  using Kind = detail::PickleValue::Kind;
  detail::PickleValue out;
  if (value.isNone()) return detail::PickleValue::of(Kind::kNone);
  if (value.isBool()) {
    out = detail::PickleValue::of(Kind::kBoolean);
    out.integer = value.toBool() ? 1 : 0;
  } else if (value.isInt()) {
    out = detail::PickleValue::of(Kind::kInteger);
    out.integer = value.toInt();
  } else if (value.isDouble()) {
    out = detail::PickleValue::of(Kind::kReal);
    out.real = value.toDouble();
  } else if (value.isString()) {
    out = detail::PickleValue::of(Kind::kString);
    out.text = value.toStringRef();
  } else if (value.isTensor()) {
    out = detail::PickleValue::of(Kind::kTensor);
    out.tensor = value.toTensor();
  } else if (value.isTuple() || value.isList()) {
    out = detail::PickleValue::of(value.isTuple() ? Kind::kTuple : Kind::kList);
    const auto elements = value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec();
    for (const auto& element : elements) out.items->push_back(to_pickle(element));
  } else if (value.isGenericDict()) {
    out = detail::PickleValue::of(Kind::kDict);
    for (const auto& entry : value.toGenericDict()) out.entries->emplace_back(to_pickle(entry.key()), to_pickle(entry.value()));
  } else {
    throw Error(str("ZeroRedundancyOptimizer: unexpected value of type ", value.tagKind(), " in an optimizer state"));
  }
  return out;
}

// Note [ZeRO state on the wire]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// consolidate_state_dict moves each rank's optimizer state as bytes: a text header, one line per
// state entry "<global index> <name> <kind> ...", then the tensors' raw bytes in header order.
// Kinds: "t <dtype> <dims> <sizes...>" (a tensor), "d <hex float>", "i <integer>", "b <0|1>". Plain
// data only: nothing is unpickled, so a peer's bytes cannot run code.
std::string encode_state(const c10::IValue& local_state, const std::vector<int64_t>& local_to_global) {
  std::ostringstream header;
  std::string payload;
  const auto state = local_state.toGenericDict().at("state").toGenericDict();
  for (const auto& entry : state) {
    const int64_t global = local_to_global.at(static_cast<size_t>(entry.key().toInt()));
    for (const auto& field : entry.value().toGenericDict()) {
      const std::string name = field.key().toStringRef();
      const c10::IValue& value = field.value();
      header << global << ' ' << name << ' ';
      if (value.isTensor()) {
        const torch::Tensor t = value.toTensor().contiguous().cpu();
        header << "t " << static_cast<int>(t.scalar_type()) << ' ' << t.dim();
        for (const int64_t size : t.sizes()) header << ' ' << size;
        payload.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
      } else if (value.isDouble()) {
        char text[64];
        std::snprintf(text, sizeof text, "%a", value.toDouble());
        header << "d " << text;
      } else if (value.isBool()) {
        header << "b " << (value.toBool() ? 1 : 0);
      } else if (value.isInt()) {
        header << "i " << value.toInt();
      } else {
        throw Error(str("ZeroRedundancyOptimizer: state entry '", name, "' is neither a tensor nor a number"));
      }
      header << '\n';
    }
  }
  const std::string text = header.str();
  return std::to_string(text.size()) + '\n' + text + payload;
}

// Adds the entries of one rank's bytes to `state` (global index -> {name: value}).
void decode_state(const std::string& bytes, int rank, c10::impl::GenericDict& state) {
  const auto fail = [rank](const std::string& what) -> void {
    throw CommunicationError(str("ZeroRedundancyOptimizer: rank ", rank, "'s state is malformed: ", what));
  };
  const size_t newline = bytes.find('\n');
  if (newline == std::string::npos) fail("no header length");
  const size_t header_size = std::stoull(bytes.substr(0, newline));
  if (newline + 1 + header_size > bytes.size()) fail("the header is cut");
  std::istringstream header(bytes.substr(newline + 1, header_size));
  size_t offset = newline + 1 + header_size;
  std::map<int64_t, c10::impl::GenericDict> fields;
  std::string line;
  while (std::getline(header, line)) {
    std::istringstream in(line);
    int64_t global = 0;
    std::string name, kind;
    if (!(in >> global >> name >> kind)) fail("a bad header line");
    auto found = fields.find(global);
    if (found == fields.end()) {
      found = fields.emplace(global, c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get())).first;
    }
    if (kind == "t") {
      int dtype = 0;
      int64_t dims = 0;
      in >> dtype >> dims;
      std::vector<int64_t> sizes(static_cast<size_t>(std::max<int64_t>(dims, 0)));
      for (auto& size : sizes) in >> size;
      if (!in || dims < 0) fail("a bad tensor line");
      torch::Tensor t = torch::empty(sizes, torch::TensorOptions().dtype(static_cast<torch::ScalarType>(dtype)));
      if (offset + t.nbytes() > bytes.size()) fail("the tensors are cut");
      std::memcpy(t.data_ptr(), bytes.data() + offset, t.nbytes());
      offset += t.nbytes();
      found->second.insert(name, t);
    } else if (kind == "d") {
      std::string text;
      in >> text;
      found->second.insert(name, std::strtod(text.c_str(), nullptr));
    } else if (kind == "i") {
      int64_t value = 0;
      in >> value;
      found->second.insert(name, value);
    } else if (kind == "b") {
      int value = 0;
      in >> value;
      found->second.insert(name, value != 0);
    } else {
      fail(str("unknown kind '", kind, "'"));
    }
  }
  for (auto& [global, dict] : fields) state.insert(global, dict);
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
  const std::string mine = encode_state(detail::optimizer_state_dict(*local_), local_to_global_);
  auto state = c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get());
  for (int r = 0; r < group_->size(); ++r) {
    std::string bytes = r == group_->rank() ? mine : std::string();
    group_->broadcast_bytes(bytes, r, "ZeRO consolidate_state_dict");
    if (group_->rank() == to) decode_state(bytes, r, state);
  }
  if (group_->rank() != to) return;
  // The whole state in Python's layout, read into this wrapper's state() as a checkpoint would be.
  consolidating_ = true;
  c10::IValue whole = detail::optimizer_state_dict(*this);  // the param groups; the state comes from the ranks
  consolidating_ = false;
  whole.toGenericDict().insert_or_assign("state", state);
  const torch::Device device = param_groups().empty() || param_groups()[0].params().empty()
                                   ? torch::Device(torch::kCPU)
                                   : param_groups()[0].params()[0].device();
  detail::load_optimizer_state_dict(*this, to_pickle(whole), device, "ZeroRedundancyOptimizer consolidated state");
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
