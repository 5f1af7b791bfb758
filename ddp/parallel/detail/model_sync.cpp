// DistributedDataParallel's communication outside the gradient path: the model check and coalesced
// broadcasts. See ddp/parallel/detail/model_sync.h.
#include "ddp/parallel/detail/model_sync.h"

#include <cstring>
#include <functional>
#include <map>

#include "ddp/base/error.h"

namespace ddp::detail {
namespace {

std::string describe(const std::string& kind, const std::string& name, const torch::Tensor& t) {
  return str(kind, " '", name, "' shape ", t.sizes(), " dtype ", t.scalar_type());
}

}  // namespace

std::vector<FlatGroup> make_flat_groups(const std::vector<torch::Tensor>& tensors) {
  std::map<std::pair<int, std::string>, FlatGroup> groups;
  std::map<std::pair<int, std::string>, std::int64_t> numels;
  for (const auto& t : tensors) numels[{static_cast<int>(t.scalar_type()), t.device().str()}] += t.numel();
  for (const auto& t : tensors) {
    const std::pair<int, std::string> key{static_cast<int>(t.scalar_type()), t.device().str()};
    FlatGroup& group = groups[key];
    if (!group.flat.defined()) group.flat = torch::empty({numels[key]}, t.options());
    std::int64_t offset = 0;
    for (const auto& v : group.views) offset += v.numel();
    group.tensors.push_back(t);
    group.views.push_back(group.flat.narrow(0, offset, t.numel()).view(t.sizes()));
  }
  std::vector<FlatGroup> out;
  for (auto& entry : groups) out.push_back(std::move(entry.second));
  return out;
}

// Note [Model check]
// ~~~~~~~~~~~~~~~~~~
// Every rank all-gathers its parameter count and one hash per parameter/buffer (name, shape,
// dtype). All ranks then compute the same first difference from the same data, all-gather the
// description of that entry, and all throw the same MismatchError: no rank is left waiting.
void verify_same_model(ProcessGroup& group, const NamedTensorList& named_params, const NamedTensorList& named_buffers) {
  const int world = group.size();
  std::vector<std::string> descriptions;
  for (const auto& [name, t] : named_params) descriptions.push_back(describe("parameter", name, t));
  for (const auto& [name, t] : named_buffers) descriptions.push_back(describe("buffer", name, t));
  const auto long_options = torch::TensorOptions().dtype(torch::kLong).device(group.device());
  auto count = torch::tensor({static_cast<std::int64_t>(descriptions.size())}, long_options);
  auto counts = group.allgather(count, "model check all-gather");
  std::vector<std::int64_t> n(world);
  std::int64_t max_n = 0;
  for (int r = 0; r < world; ++r) {
    n[r] = counts[r].cpu().item<std::int64_t>();
    max_n = std::max(max_n, n[r]);
  }
  auto hashes = torch::zeros({max_n + 1}, torch::kLong);
  for (std::size_t i = 0; i < descriptions.size(); ++i) {
    hashes[static_cast<std::int64_t>(i)] =
        static_cast<std::int64_t>(std::hash<std::string>{}(descriptions[i]) >> 1);
  }
  auto gathered = group.allgather(hashes.to(group.device()), "model check all-gather");
  std::vector<torch::Tensor> all;
  for (auto& g : gathered) all.push_back(g.cpu());
  // First (index, rank) whose entry differs from rank 0's.
  std::int64_t bad_index = -1;
  int bad_rank = -1;
  for (std::int64_t i = 0; i <= max_n && bad_index < 0; ++i) {
    for (int r = 1; r < world; ++r) {
      const bool present0 = i < n[0], present = i < n[r];
      if (present0 != present || (present && all[r][i].item<std::int64_t>() != all[0][i].item<std::int64_t>())) {
        bad_index = i;
        bad_rank = r;
        break;
      }
    }
  }
  if (bad_index < 0) return;
  constexpr std::int64_t kWidth = 512;
  std::string mine = bad_index < static_cast<std::int64_t>(descriptions.size())
                         ? descriptions[bad_index]
                         : str("nothing (it has only ", descriptions.size(), " parameters and buffers)");
  mine.resize(kWidth - 1, '\0');
  auto text = torch::zeros({kWidth}, torch::kByte);
  std::memcpy(text.data_ptr<std::uint8_t>(), mine.data(), mine.size());
  auto texts = group.allgather(text.to(group.device()), "model check all-gather");
  const auto read = [&](int r) {
    auto t = texts[r].cpu();
    return std::string(reinterpret_cast<const char*>(t.data_ptr<std::uint8_t>()));
  };
  throw MismatchError(str("DistributedDataParallel: the model differs between ranks: entry #", bad_index,
                          " is ", read(bad_rank), " on rank ", bad_rank, " but ", read(0),
                          " on rank 0 (rank 0 has ", n[0], " parameters and buffers, rank ", bad_rank,
                          " has ", n[bad_rank], "); every rank must build the same model"));
}

void broadcast_coalesced(ProcessGroup& group, int src, const std::vector<torch::Tensor>& tensors, const char* what) {
  if (tensors.empty()) return;
  auto groups = make_flat_groups(tensors);
  broadcast_flat_groups(group, src, groups, what);
}

void broadcast_flat_groups(ProcessGroup& group, int src, std::vector<FlatGroup>& groups, const char* what) {
  torch::NoGradGuard no_grad;
  for (auto& g : groups) {
    if (group.rank() == src) {
      for (std::size_t i = 0; i < g.tensors.size(); ++i) g.views[i].copy_(g.tensors[i]);
    }
    group.broadcast(g.flat, src, what);
    if (group.rank() != src) {
      for (std::size_t i = 0; i < g.tensors.size(); ++i) g.tensors[i].copy_(g.views[i]);
    }
  }
}

}  // namespace ddp::detail
