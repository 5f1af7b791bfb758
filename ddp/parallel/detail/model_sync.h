#pragma once
// DistributedDataParallel's communication outside the gradient path (internal, not installed): the
// check that every rank built the same model, and coalesced broadcasts of parameters and buffers
// (c10d's verify_params_across_processes and broadcast_coalesced).
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "ddp/distributed/process_group.h"

namespace ddp::detail {

using NamedTensorList = std::vector<std::pair<std::string, torch::Tensor>>;

// Tensors of one dtype and device packed into one flat tensor, for broadcasts.
struct FlatGroup {
  torch::Tensor flat;
  std::vector<torch::Tensor> tensors;
  std::vector<torch::Tensor> views;
};
std::vector<FlatGroup> make_flat_groups(const std::vector<torch::Tensor>& tensors);

// See Note [Model check]. Throws ddp::MismatchError on every rank when the models differ.
void verify_same_model(ProcessGroup& group, const NamedTensorList& params, const NamedTensorList& buffers);

// Copies `src`'s tensors into every rank's, one broadcast per dtype and device.
void broadcast_coalesced(ProcessGroup& group, int src, const std::vector<torch::Tensor>& tensors,
                         const char* what = "parameter broadcast");
// The same over groups packed once (buffers, broadcast at every forward).
void broadcast_flat_groups(ProcessGroup& group, int src, std::vector<FlatGroup>& groups, const char* what);

}  // namespace ddp::detail
