// Worker of the SyncBatchNorm tests: one process per rank, started by ddp_launch (Gloo on
// 127.0.0.1). Each subcommand exits 0 when the behaviour holds, 1 with the reason on stderr.
//
//   module     ddp::SyncBatchNorm (1d, 2d and 3d inputs) on uneven per-rank batches equals one
//              BatchNorm over the concatenated batch: outputs, input gradients, weight and bias
//              gradients (summed over ranks), running statistics, and eval-mode outputs.
//              --rows-base B: rank r has B + r rows (B = 0 gives rank 0 an empty batch).
//   ddp        a Sequential CNN with BatchNorm2d, converted by convert_sync_batchnorm and trained
//              with DistributedDataParallel on uneven batches, equals single-process training on the
//              concatenated batch (parameters and running statistics).
//   convert    convert_sync_batchnorm: a Sequential (root, or registered by name only) converted with values, mode and
//              process group kept; a BatchNorm held by a member is refused naming its path, with
//              the model unchanged; a declared ddp::SyncBatchNorm gets the group.
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <vector>

#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"
#include "ddp/parallel/sync_batch_norm.h"

namespace {

constexpr double kRtol = 1e-5, kAtol = 1e-8;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what) {
  if (actual.sizes() != expected.sizes() || !torch::allclose(actual, expected, kRtol, kAtol)) {
    const double diff = actual.sizes() == expected.sizes() ? (actual - expected).abs().max().item<double>() : -1.0;
    throw Failure(ddp::str(what, ": not equal to the single-BatchNorm reference (max abs difference ", diff,
                           ", shapes ", actual.sizes(), " vs ", expected.sizes(), ")"));
  }
}

void expect(bool condition, const std::string& what) {
  if (!condition) throw Failure(what);
}

std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) return argv[i + 1];
  }
  return fallback;
}

// Rows of rank r: base + r. Returns (offset of this rank's rows, its row count, total rows).
struct Split {
  int64_t offset = 0, rows = 0, total = 0;
};
Split split_for(int rank, int world, int64_t base) {
  Split s;
  for (int r = 0; r < world; ++r) {
    if (r < rank) s.offset += base + r;
    s.total += base + r;
  }
  s.rows = base + rank;
  return s;
}

template <class Reference>
void check_module(ddp::ProcessGroup& pg, int spatial_dims, int64_t base) {
  const int64_t channels = 3;
  const Split split = split_for(pg.rank(), pg.size(), base);
  const auto options = torch::nn::BatchNormOptions(channels).momentum(0.3);
  ddp::SyncBatchNorm sync(options, std::shared_ptr<ddp::ProcessGroup>(&pg, [](auto*) {}));
  Reference reference(options);
  sync->to(torch::kDouble);
  reference->to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    sync->weight.copy_(torch::linspace(0.5, 1.5, channels, torch::kDouble));
    sync->bias.copy_(torch::linspace(-0.2, 0.2, channels, torch::kDouble));
    reference->weight.copy_(sync->weight);
    reference->bias.copy_(sync->bias);
  }
  std::vector<int64_t> shape{split.total, channels};
  for (int d = 0; d < spatial_dims; ++d) shape.push_back(3 + d);
  const std::string name = ddp::str(spatial_dims + 2, "-d input, rows ", split.rows, " of ", split.total);
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + step);
    // Shifted and scaled, so that the mean and the variance matter.
    auto global = (torch::randn(shape, torch::kDouble) * 2.5 + 4.0).requires_grad_(true);
    auto weights = torch::randn(shape, torch::kDouble);
    auto local = global.detach().narrow(0, split.offset, split.rows).clone().requires_grad_(true);

    auto out = sync(local);
    (out * weights.narrow(0, split.offset, split.rows)).sum().backward();
    auto ref_out = reference(global);
    (ref_out * weights).sum().backward();

    const std::string at = ddp::str(name, ", step ", step);
    expect_close(out, ref_out.detach().narrow(0, split.offset, split.rows), "output (" + at + ")");
    expect_close(local.grad(), global.grad().narrow(0, split.offset, split.rows), "input gradient (" + at + ")");
    auto weight_grad = sync->weight.grad().clone();
    auto bias_grad = sync->bias.grad().clone();
    pg.allreduce(weight_grad);
    pg.allreduce(bias_grad);
    expect_close(weight_grad, reference->weight.grad(), "weight gradient summed over ranks (" + at + ")");
    expect_close(bias_grad, reference->bias.grad(), "bias gradient summed over ranks (" + at + ")");
    expect_close(sync->running_mean, reference->running_mean, "running_mean (" + at + ")");
    expect_close(sync->running_var, reference->running_var, "running_var (" + at + ")");
    expect(sync->num_batches_tracked.item<int64_t>() == step + 1, "num_batches_tracked counts the steps");
    sync->zero_grad();
    reference->zero_grad();
  }
  // Eval mode: running statistics, no collective (rank 0 may evaluate alone).
  sync->eval();
  reference->eval();
  if (pg.rank() == 0) {
    torch::manual_seed(7);
    auto x = torch::randn(shape, torch::kDouble);
    torch::NoGradGuard no_grad;
    expect_close(sync(x), reference(x), "eval-mode output (" + name + ")");
  }
  pg.barrier();
}

int run_module(ddp::ProcessGroup& pg, int64_t base) {
  check_module<torch::nn::BatchNorm1d>(pg, 0, base);  // [N, C]
  check_module<torch::nn::BatchNorm1d>(pg, 1, base);  // [N, C, L]
  check_module<torch::nn::BatchNorm2d>(pg, 2, base);
  check_module<torch::nn::BatchNorm3d>(pg, 3, base);
  return 0;
}

torch::nn::Sequential make_cnn() {
  torch::manual_seed(42);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)), torch::nn::BatchNorm2d(4),
                            torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(4 * 4 * 4, 3));
  net->to(torch::kDouble);
  return net;
}

// Rank r trains on its rows with loss = world * sum(row losses) / total rows, so that DDP's average
// over ranks is the mean loss over the concatenated batch, which the reference minimises.
int run_ddp(ddp::ProcessGroup& pg) {
  const int world = pg.size();
  const Split split = split_for(pg.rank(), world, 2);
  auto group = std::shared_ptr<ddp::ProcessGroup>(&pg, [](auto*) {});
  auto net = ddp::convert_sync_batchnorm(make_cnn(), group);
  expect(std::dynamic_pointer_cast<ddp::SyncBatchNormImpl>(net->ptr(1)) != nullptr, "entry 1 is a SyncBatchNorm");
  ddp::DistributedDataParallel<torch::nn::Sequential> model(net, group);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto reference = make_cnn();
  torch::optim::SGD ref_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(500 + step);
    auto x = torch::randn({split.total, 1, 6, 6}, torch::kDouble) * 1.5 + 0.5;
    auto y = torch::randint(0, 3, {split.total}, torch::kLong);
    auto out = model(x.narrow(0, split.offset, split.rows));
    auto loss = torch::nn::functional::cross_entropy(
                    out, y.narrow(0, split.offset, split.rows),
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) *
                (static_cast<double>(world) / static_cast<double>(split.total));
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    ref_optimizer.step();
    ref_optimizer.zero_grad();
  }
  const auto mine = net->named_parameters();
  for (const auto& p : reference->named_parameters()) {
    expect_close(mine[p.key()], p.value(), "parameter " + p.key() + " after 5 DDP steps");
  }
  const auto my_buffers = net->named_buffers();
  for (const auto& b : reference->named_buffers()) {
    if (b.value().is_floating_point()) expect_close(my_buffers[b.key()], b.value(), "buffer " + b.key());
  }
  return 0;
}

struct WithMemberImpl : torch::nn::Module {
  WithMemberImpl()
      : fc(register_module("fc", torch::nn::Linear(4, 4))), bn(register_module("bn", torch::nn::BatchNorm1d(4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)); }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d bn;
};
TORCH_MODULE(WithMember);

struct DeclaredImpl : torch::nn::Module {
  DeclaredImpl() : bn(register_module("bn", ddp::SyncBatchNorm(4))) {}
  ddp::SyncBatchNorm bn;
};
TORCH_MODULE(Declared);

// Registers its Sequential by name only and looks it up in forward: convertible in place.
struct ByNameImpl : torch::nn::Module {
  ByNameImpl() { register_module("features", torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4))); }
  torch::Tensor forward(const torch::Tensor& x) {
    return std::dynamic_pointer_cast<torch::nn::SequentialImpl>(named_children()["features"])->forward(x);
  }
};
TORCH_MODULE(ByName);

int run_convert(ddp::ProcessGroup& pg) {
  auto group = std::shared_ptr<ddp::ProcessGroup>(&pg, [](auto*) {});
  // A Sequential: rebuilt; values, mode and options carried over; other entries shared.
  torch::nn::Sequential seq(torch::nn::Linear(4, 4),
                            torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(4).eps(1e-3).momentum(0.25)));
  seq->eval();
  {
    torch::NoGradGuard no_grad;
    seq[1]->as<torch::nn::BatchNorm1d>()->running_mean.fill_(0.5);
    seq[1]->as<torch::nn::BatchNorm1d>()->weight.fill_(2.0);
  }
  auto converted = ddp::convert_sync_batchnorm(seq, group);
  auto sync = std::dynamic_pointer_cast<ddp::SyncBatchNormImpl>(converted->ptr(1));
  expect(sync != nullptr, "the BatchNorm1d inside the Sequential became a SyncBatchNorm");
  expect(sync->process_group().get() == &pg, "the SyncBatchNorm has the process group");
  expect(!sync->is_training(), "eval mode is kept");
  expect(sync->options.eps() == 1e-3 && sync->options.momentum() == 0.25, "options are kept");
  expect(torch::equal(sync->running_mean, torch::full({4}, 0.5)), "running_mean is copied");
  expect(torch::equal(sync->weight, torch::full({4}, 2.0)), "weight is copied");
  expect(converted->named_parameters().keys() == seq->named_parameters().keys(), "same parameter names");
  expect(converted->ptr(0).get() == seq->ptr(0).get(), "other modules are shared, not copied");
  const auto x = torch::randn({3, 4});
  expect(torch::allclose(converted->forward(x), seq->forward(x)), "the converted Sequential computes the same in eval");

  // A Sequential registered by name only: replaced in place inside its parent.
  ByName by_name;
  auto same_root = ddp::convert_sync_batchnorm(by_name.ptr(), group);
  expect(same_root.get() == by_name.ptr().get(), "the parent is converted in place");
  auto features = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(by_name->named_children()["features"]);
  expect(features != nullptr && std::dynamic_pointer_cast<ddp::SyncBatchNormImpl>(features->ptr(1)) != nullptr,
         "the parent's Sequential now holds a SyncBatchNorm");
  expect(by_name->forward(torch::randn({3, 4})).size(1) == 4, "the converted parent runs");

  // A member handle: refused, naming the path, nothing changed.
  WithMember with_member;
  try {
    ddp::convert_sync_batchnorm(with_member.ptr(), group);
    throw Failure("a BatchNorm held by a member was replaced");
  } catch (const ddp::InvalidArgument& error) {
    const std::string what = error.what();
    expect(what.find("'bn'") != std::string::npos && what.find("ddp::SyncBatchNorm") != std::string::npos,
           "the refusal names the path and the fix: " + what);
  }
  expect(std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(with_member->named_children()["bn"]) != nullptr,
         "the refused model is unchanged");

  // Declared SyncBatchNorm: gets the group in place.
  Declared declared;
  expect(declared->bn->process_group() == nullptr, "no group before converting");
  auto same = ddp::convert_sync_batchnorm(declared.ptr(), group);
  expect(same.get() == declared.ptr().get(), "a model with declared SyncBatchNorm is converted in place");
  expect(declared->bn->process_group().get() == &pg, "the declared SyncBatchNorm got the group");

  // Bad input: one clear error.
  try {
    declared->bn->train();
    declared->bn(torch::zeros({2, 5}));
    throw Failure("a wrong channel count was accepted");
  } catch (const ddp::InvalidArgument& error) {
    expect(std::string(error.what()).find("[N, 4, *]") != std::string::npos, "the error names the expected shape");
  }
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2) throw ddp::InvalidArgument("usage: sync_bn_worker module|ddp|convert [--rows-base B]");
  const std::string command = argv[1];
  ddp::InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(30);
  auto pg = ddp::init_process_group(init);
  try {
    if (command == "module") return run_module(*pg, std::stoll(arg(argc, argv, "rows-base", "2")));
    if (command == "ddp") return run_ddp(*pg);
    if (command == "convert") return run_convert(*pg);
  } catch (const Failure& failure) {
    std::cerr << "FAILED on rank " << pg->rank() << ": " << failure.what() << "\n";
    return 1;
  }
  throw ddp::InvalidArgument("unknown subcommand " + command);
}

}  // namespace

int main(int argc, char** argv) { return ddp::run_main(argc, argv, run); }
