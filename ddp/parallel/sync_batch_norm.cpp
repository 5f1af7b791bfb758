#include "ddp/parallel/sync_batch_norm.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <utility>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/base/str.h"

namespace ddp {
namespace {

using torch::autograd::variable_list;

// Statistics are computed in double for double inputs, in float otherwise (half inputs included).
torch::ScalarType stats_dtype(const torch::Tensor& input) {
  return input.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// Every dimension but the channel dimension 1.
std::vector<int64_t> reduce_dims(const torch::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// [C] -> [1, C, 1, ...] for broadcasting over an input of input_dim dimensions.
torch::Tensor per_channel(const torch::Tensor& values, int64_t input_dim) {
  std::vector<int64_t> shape(static_cast<std::size_t>(input_dim), 1);
  shape[1] = values.size(0);
  return values.view(shape);
}

struct GlobalStats {
  torch::Tensor mean;      // [C], stats dtype
  torch::Tensor invstd;    // [C], 1 / sqrt(biased variance + eps)
  torch::Tensor unbiased;  // [C], for the running variance
  double count = 0;        // rows per channel over all ranks
};

// Steps 1 and 2 of the algorithm (see Note [SyncBatchNorm]): one all-gather of (mean, M2, count) per rank.
GlobalStats gather_stats(const torch::Tensor& input, double eps, ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  const int64_t channels = input.size(1);
  const auto options = input.options().dtype(stats_dtype(input));
  const auto x = input.to(stats_dtype(input));
  const auto dims = reduce_dims(input);
  const int64_t rows = channels == 0 ? 0 : input.numel() / channels;
  auto local = torch::zeros({2 * channels + 1}, options);
  if (rows > 0) {
    const auto mean = x.mean(dims);
    local.narrow(0, 0, channels).copy_(mean);
    local.narrow(0, channels, channels).copy_((x - per_channel(mean, x.dim())).square().sum(dims));
  }
  local[2 * channels].fill_(static_cast<double>(rows));
  const auto all = torch::stack(group.allgather(local));  // [world, 2C+1]
  const auto counts = all.select(1, 2 * channels).unsqueeze(1);
  const auto means = all.narrow(1, 0, channels);
  const auto m2s = all.narrow(1, channels, channels);
  GlobalStats stats;
  stats.count = counts.sum().item<double>();
  if (stats.count <= 1) {
    throw InvalidArgument(str("SyncBatchNorm: expected more than 1 value per channel over all ranks when training, got ",
                              stats.count, " (input shape ", input.sizes(), " on rank ", group.rank(), ")"));
  }
  stats.mean = (means * counts).sum(0) / stats.count;
  const auto m2 = m2s.sum(0) + (counts * (means - stats.mean).square()).sum(0);
  stats.invstd = (m2 / stats.count + eps).rsqrt();
  stats.unbiased = m2 / (stats.count - 1);
  return stats;
}

// The backward (see Note [SyncBatchNorm]). Inputs of the forward: (input, weight, bias).
struct SyncBatchNormBackward : torch::autograd::Node {
  std::shared_ptr<ProcessGroup> group;
  torch::autograd::SavedVariable input;
  torch::autograd::SavedVariable weight;
  torch::Tensor mean, invstd;
  double count = 0;

  std::string name() const override { return "ddp::SyncBatchNormBackward"; }
  void release_variables() override {
    input.reset_data();
    weight.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    const auto x_saved = input.unpack();
    const auto w = weight.unpack();
    const auto dtype = stats_dtype(x_saved);
    // An undefined gradient means zeros; the all-reduce must still run, as on every other rank.
    const auto dy = grads[0].defined() ? grads[0].to(dtype) : torch::zeros_like(x_saved, x_saved.options().dtype(dtype));
    const auto dims = reduce_dims(x_saved);
    const int64_t channels = x_saved.size(1), dim = x_saved.dim();
    const auto xmu = x_saved.to(dtype) - per_channel(mean, dim);
    const auto sum_dy = dy.sum(dims);
    const auto sum_dy_xmu = (dy * xmu).sum(dims);
    variable_list out(3);
    if (should_compute_output(0)) {
      auto both = torch::cat({sum_dy, sum_dy_xmu});
      group->allreduce(both);
      const auto global_sum_dy = both.narrow(0, 0, channels);
      const auto global_sum_dy_xmu = both.narrow(0, channels, channels);
      const auto scale = w.defined() ? invstd * w.to(dtype) : invstd;
      auto dx = (dy - per_channel(global_sum_dy / count, dim) -
                 xmu * per_channel(invstd.square() * global_sum_dy_xmu / count, dim)) *
                per_channel(scale, dim);
      out[0] = dx.to(x_saved.scalar_type());
    }
    if (should_compute_output(1)) out[1] = (sum_dy_xmu * invstd).to(w.scalar_type());
    if (should_compute_output(2)) out[2] = sum_dy.to(w.defined() ? w.scalar_type() : x_saved.scalar_type());
    return out;
  }
};

// Autograd nodes are held by std::shared_ptr in older LibTorch releases and by c10::intrusive_ptr in
// newer ones (2.13 and 2.14 here); make the node the way this LibTorch's Edge holds it.
using NodePtr = decltype(std::declval<torch::autograd::Edge>().function);
template <class T, class Ptr = NodePtr>
struct NodeMaker;
template <class T>
struct NodeMaker<T, std::shared_ptr<torch::autograd::Node>> {
  static std::shared_ptr<T> make() { return std::make_shared<T>(); }
};
template <class T>
struct NodeMaker<T, c10::intrusive_ptr<torch::autograd::Node>> {
  static c10::intrusive_ptr<T> make() { return c10::make_intrusive<T>(); }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, std::shared_ptr<ProcessGroup> group)
    : NormImplBase(options), group_(std::move(group)) {}

void SyncBatchNormImpl::_check_input_dim(const torch::Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options.num_features()) {
    throw InvalidArgument(str("SyncBatchNorm(", options.num_features(), ") expects an input of shape [N, ",
                              options.num_features(), ", *], got ", input.sizes()));
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "ddp::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats()
         << ", ranks=" << (group_ ? group_->size() : 1) << ")";
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  _check_input_dim(input);
  const bool track = options.track_running_stats();
  double factor = options.momentum().value_or(0.0);
  if (is_training() && track && num_batches_tracked.defined()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    if (!options.momentum()) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  const bool batch_stats = is_training() || !track;
  if (!is_training() || !group_ || group_->size() == 1) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, batch_stats, factor, options.eps(),
                             /*cudnn_enabled=*/true);
  }

  const GlobalStats stats = gather_stats(input, options.eps(), *group_);
  torch::Tensor output;
  {
    torch::NoGradGuard no_grad;
    if (track) {
      running_mean.mul_(1 - factor).add_(stats.mean.to(running_mean.scalar_type()), factor);
      running_var.mul_(1 - factor).add_(stats.unbiased.to(running_var.scalar_type()), factor);
    }
    const int64_t dim = input.dim();
    auto y = (input.to(stats.mean.scalar_type()) - per_channel(stats.mean, dim)) * per_channel(stats.invstd, dim);
    if (weight.defined()) y = y * per_channel(weight.to(y.scalar_type()), dim);
    if (bias.defined()) y = y + per_channel(bias.to(y.scalar_type()), dim);
    output = y.to(input.scalar_type());
  }
  const bool needs_grad = torch::GradMode::is_enabled() &&
                          (input.requires_grad() || (weight.defined() && weight.requires_grad()) ||
                           (bias.defined() && bias.requires_grad()));
  if (needs_grad) {
    auto node = NodeMaker<SyncBatchNormBackward>::make();
    node->group = group_;
    node->input = torch::autograd::SavedVariable(input, /*is_output=*/false);
    if (weight.defined()) node->weight = torch::autograd::SavedVariable(weight, /*is_output=*/false);
    node->mean = stats.mean;
    node->invstd = stats.invstd;
    node->count = stats.count;
    node->set_next_edges(torch::autograd::collect_next_edges(input, weight, bias));
    torch::autograd::create_gradient_edge(output, node);
  }
  return output;
}

// --- convert_sync_batchnorm ------------------------------------------------------------------------

namespace {

// A SyncBatchNorm with the options, values, mode, device and dtype of a BatchNorm; null when
// `module` is not a BatchNorm1d/2d/3d.
std::shared_ptr<SyncBatchNormImpl> sync_copy(const std::shared_ptr<torch::nn::Module>& module,
                                             const std::shared_ptr<ProcessGroup>& group) {
  std::optional<torch::nn::BatchNormOptions> options;
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module)) options = bn->options;
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module)) options = bn->options;
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(module)) options = bn->options;
  if (!options) return nullptr;
  auto sync = std::make_shared<SyncBatchNormImpl>(*options, group);
  torch::NoGradGuard no_grad;
  const auto params = module->named_parameters(/*recurse=*/false);
  const auto buffers = module->named_buffers(/*recurse=*/false);
  for (auto& p : sync->named_parameters(/*recurse=*/false)) p.value().set_data(params[p.key()].detach().clone());
  for (auto& b : sync->named_buffers(/*recurse=*/false)) b.value().set_data(buffers[b.key()].detach().clone());
  sync->train(module->is_training());
  return sync;
}

std::string child_path(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

// Returns the module that replaces `module` (itself when it was converted in place). With
// apply == false nothing in the tree is changed: only the checks run (see convert_sync_batchnorm).
std::shared_ptr<torch::nn::Module> convert(const std::shared_ptr<torch::nn::Module>& module,
                                           const std::shared_ptr<ProcessGroup>& group, const std::string& path,
                                           bool apply) {
  if (auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(module)) {
    if (apply) sync->set_process_group(group);
    return module;
  }
  if (auto replacement = sync_copy(module, group)) return replacement;
  const auto children = module->named_children();
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> replaced;
  for (const auto& child : children) {
    auto converted = convert(child.value(), group, child_path(path, child.key()), apply);
    if (converted != child.value()) replaced.emplace_back(child.key(), std::move(converted));
  }
  if (replaced.empty()) return module;

  if (auto sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module)) {
    // A Sequential keeps its entries in AnyModules of its own: build a new one.
    auto fresh = std::make_shared<torch::nn::SequentialImpl>();
    std::size_t index = 0, next = 0;
    for (const auto& entry : *sequential) {
      const std::string& name = children[index++].key();
      if (next < replaced.size() && replaced[next].first == name) {
        // Only a BatchNorm is replaced inside a Sequential (a Sequential cannot hold a Sequential).
        auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(replaced[next++].second);
        DDP_CHECK(sync != nullptr, "convert_sync_batchnorm: unexpected replacement of '", child_path(path, name), "'");
        fresh->push_back(name, sync);
      } else {
        fresh->push_back(name, entry);
      }
    }
    fresh->train(sequential->is_training());
    return fresh;
  }
  for (const auto& [name, converted] : replaced) {
    // The tree's own reference plus `children`: anything more is a handle forward would still use.
    if (children[name].use_count() > 2) {
      const bool is_sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(converted) != nullptr;
      throw InvalidArgument(str(
          "convert_sync_batchnorm: cannot replace the ", is_sequential ? "Sequential (it holds BatchNorm modules)" : "BatchNorm",
          " at '", child_path(path, name), "': its parent keeps its own handle to it (a member or a container entry), ",
          "so forward would go on using the old module. Declare ddp::SyncBatchNorm in the model instead ",
          "(same options and parameter names); convert_sync_batchnorm then gives it the process group. ",
          "See Note [convert_sync_batchnorm] in ddp/parallel/sync_batch_norm.h"));
    }
  }
  if (apply) {
    for (const auto& [name, converted] : replaced) module->replace_module(name, converted);
  }
  return module;
}

}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& module,
                                                          std::shared_ptr<ProcessGroup> group) {
  if (!module) throw InvalidArgument("convert_sync_batchnorm: the module is null");
  convert(module, group, "", /*apply=*/false);  // throws before anything is changed
  return convert(module, group, "", /*apply=*/true);
}

torch::nn::Sequential convert_sync_batchnorm(const torch::nn::Sequential& module, std::shared_ptr<ProcessGroup> group) {
  auto converted = convert_sync_batchnorm(std::shared_ptr<torch::nn::Module>(module.ptr()), std::move(group));
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(converted));
}

}  // namespace ddp
