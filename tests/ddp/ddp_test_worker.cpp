// Worker of the multi-process DistributedDataParallel tests: one process per rank, started by a
// launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Each subcommand checks one
// behaviour and exits 0 when it holds, 1 (with the reason on stderr) when it does not.
//
//   train      DDP training equals single-process training (see Note [Equivalence reference])
//   unused     without find_unused_parameters: backward fails naming the unused parameters
//   mismatch   rank 1 builds a different model: every rank fails naming rank 1 and the parameter
//   world      rank 1 claims another world size: every rank fails with the inconsistency
//   timeout    this rank waits for a rank that never arrives: TimeoutError after --timeout-ms
//   unreachable  no master listens: CommunicationError naming the address
//   collectives  init through --init-method, all-reduce, broadcast, allgather, barrier, main_process_first
//   eval_on_rank0  rank 0 alone runs no-grad forwards between steps: no hang, same parameters
//   fail       rank 1 throws: run_main writes the launcher's error file
//   average    the averaged gradient is PyTorch's bit for bit (see Note [Dividing on the copy])
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"

namespace {

using Args = std::map<std::string, std::string>;

Args parse_args(int argc, char** argv, int first) {
  Args args;
  for (int i = first; i < argc; ++i) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0) throw ddp::InvalidArgument("unexpected argument " + key);
    key = key.substr(2);
    if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      args[key] = argv[++i];
    } else {
      args[key] = "1";
    }
  }
  return args;
}

std::string get(const Args& args, const std::string& key, const std::string& fallback) {
  auto it = args.find(key);
  return it == args.end() ? fallback : it->second;
}
long get_int(const Args& args, const std::string& key, long fallback) {
  return std::stol(get(args, key, std::to_string(fallback)));
}

int fail(const std::string& why) {
  std::cerr << "FAILED: " << why << "\n";
  return 1;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// --- models (double precision, so that reduction order does not blur the comparison) -------------

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int hidden = 16)
      : fc1(register_module("fc1", torch::nn::Linear(8, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(4))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3)))),
        fc(register_module("fc", torch::nn::Linear(8 * 4 * 4, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(bn(conv1(x)));
    h = torch::relu(conv2(h));
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Cnn);

// Registered head first, stem last, but used stem -> mid -> head: backward readies the head's
// gradients first, the opposite of reverse registration order (see Note [Bucket rebuild]).
struct ShuffledImpl : torch::nn::Module {
  ShuffledImpl()
      : head(register_module("head", torch::nn::Linear(16, 4))),
        mid(register_module("mid", torch::nn::Linear(16, 16))),
        stem(register_module("stem", torch::nn::Linear(8, 16))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::tanh(mid(torch::tanh(stem(x))))); }
  torch::nn::Linear head, mid, stem;
};
TORCH_MODULE(Shuffled);

// `extra` is used only when asked (rank-dependent in the tests); `never` is never used.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 4))),
        extra(register_module("extra", torch::nn::Linear(8, 4))),
        never(register_module("never", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_extra) {
    auto out = fc2(torch::tanh(fc1(x)));
    return use_extra ? out + extra(x) : out;
  }
  torch::nn::Linear fc1, fc2, extra, never;
};
TORCH_MODULE(Branchy);

// --- train ---------------------------------------------------------------------------------------

// The parameters of a bucket layout in launch order: full names with '|' between buckets, or only
// the module prefixes ("head,mid,stem"), consecutive repeats collapsed.
std::string layer_order(const std::vector<std::vector<std::string>>& layout, bool full) {
  std::string out, last;
  for (const auto& bucket : layout) {
    if (full && !out.empty()) out += "|";
    for (const auto& name : bucket) {
      const std::string item = full ? name : name.substr(0, name.find('.'));
      if (!full && item == last) continue;
      if (!out.empty() && out.back() != '|') out += ",";
      out += item;
      last = item;
    }
  }
  return out;
}

// Note [Equivalence reference]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Rank r trains on rows [r*B, (r+1)*B) of each global batch; rank 0 also trains a plain copy of
// the model (initialised like rank 0's, whose parameters DDP broadcasts) on the global batch.
// MLP: one forward over the concatenated batch. Models whose forward depends on the rank's chunk
// (BatchNorm in train mode normalises with per-replica statistics, as DDP without SyncBatchNorm
// does; the branchy model uses `extra` only on even ranks) compute the same loss as the mean of
// the per-chunk losses, which is what averaging per-rank gradients computes. Uneven inputs (join)
// sum the losses of the ranks still training and divide by the world size, PyTorch's default.
template <class Model, class Forward>
int run_train(const Args& args, ddp::ProcessGroup& pg, Model ddp_net, Model ref_net, Forward forward) {
  const int world = pg.size(), rank = pg.rank();
  const long steps = get_int(args, "steps", 20), batch = get_int(args, "batch", 4);
  const long accumulate = get_int(args, "accumulate", 1);
  const double rtol = 1e-5;
  const bool uneven = args.count("join") > 0;
  const std::string model_name = get(args, "model", "mlp");
  const bool chunked = model_name != "mlp";

  ddp::DdpOptions options;
  options.bucket_cap_bytes = static_cast<std::size_t>(get_int(args, "bucket-cap-bytes", 25 << 20));
  options.first_bucket_cap_bytes = static_cast<std::size_t>(get_int(args, "first-bucket-bytes", 1 << 20));
  options.find_unused_parameters = args.count("find-unused") > 0;
  options.gradient_as_bucket_view = args.count("grad-view") > 0;
  options.comm_hook = *ddp::parse_comm_hook(get(args, "hook", "allreduce"));
  options.rebuild_buckets = args.count("no-rebuild") == 0;
  ddp::DistributedDataParallel<Model> model(ddp_net, std::shared_ptr<ddp::ProcessGroup>(&pg, [](auto*) {}), options);
  const auto initial_layout = model.bucket_parameter_names();
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD ref_optimizer(ref_net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // The global data, the same on every rank.
  torch::manual_seed(1234);
  const bool image = model_name == "cnn";
  std::vector<torch::Tensor> xs, ys;
  for (long i = 0; i < steps * accumulate; ++i) {
    xs.push_back(image ? torch::randn({world * batch, 1, 8, 8}, torch::kDouble)
                       : torch::randn({world * batch, 8}, torch::kDouble));
    ys.push_back(torch::randn({world * batch, 4}, torch::kDouble));
  }
  // Uneven inputs: rank r runs steps - 2 (world - 1 - r) steps, so rank 0 runs out first and must
  // end with the parameters of the last rank.
  const auto steps_of = [&](int r) { return uneven ? std::max(1L, steps - 2L * (world - 1 - r)) : steps; };

  const auto train_ddp = [&] {
    for (long step = 0; step < steps_of(rank); ++step) {
      for (long micro = 0; micro < accumulate; ++micro) {
        const auto& x = xs[step * accumulate + micro];
        const auto& y = ys[step * accumulate + micro];
        std::optional<ddp::NoSyncGuard> no_sync;
        if (micro + 1 < accumulate) no_sync.emplace(model.no_sync());
        auto out = forward(model, x.narrow(0, rank * batch, batch), rank);
        torch::mse_loss(out, y.narrow(0, rank * batch, batch)).backward();
      }
      optimizer.step();
      optimizer.zero_grad();
    }
  };
  if (uneven) {
    model.join(train_ddp);
  } else {
    train_ddp();
  }

  // Every rank must hold exactly rank 0's parameters.
  for (auto& p : model.parameters()) {
    auto mine = p.detach().clone();
    auto root = mine.clone();
    pg.broadcast(root, 0);
    if (!torch::equal(mine, root)) return fail("parameters differ from rank 0's after training");
  }
  // Bucket layouts (see Note [Bucket rebuild]): the same on every rank; before and after training the
  // layers follow --initial-order and --final-order (module prefixes in launch order).
  const auto final_layout = model.bucket_parameter_names();
  auto layout_hash = torch::tensor({static_cast<std::int64_t>(std::hash<std::string>{}(layer_order(final_layout, true)) >> 1)});
  auto root_hash = layout_hash.clone();
  pg.broadcast(root_hash, 0);
  if (!torch::equal(layout_hash, root_hash)) {
    return fail("rank " + std::to_string(rank) + " has another bucket layout than rank 0: " + layer_order(final_layout, true));
  }
  for (const auto& [flag, layout] : {std::pair{"initial-order", initial_layout}, std::pair{"final-order", final_layout}}) {
    if (args.count(flag) && layer_order(layout, false) != get(args, flag, "")) {
      return fail(ddp::str("--", flag, ": buckets launch the layers in the order ", layer_order(layout, false),
                           " (", layer_order(layout, true), "), expected ", get(args, flag, "")));
    }
  }
  if (rank != 0) return 0;

  for (long step = 0; step < steps; ++step) {
    for (long micro = 0; micro < accumulate; ++micro) {
      const auto& x = xs[step * accumulate + micro];
      const auto& y = ys[step * accumulate + micro];
      torch::Tensor loss;
      if (!chunked && !uneven) {
        loss = torch::mse_loss(forward(ref_net, x, 0), y);
      } else {
        loss = torch::zeros({}, torch::kDouble);
        for (int r = 0; r < world; ++r) {
          if (step >= steps_of(r)) continue;
          loss = loss + torch::mse_loss(forward(ref_net, x.narrow(0, r * batch, batch), r),
                                        y.narrow(0, r * batch, batch));
        }
        loss = loss / world;
      }
      loss.backward();
    }
    ref_optimizer.step();
    ref_optimizer.zero_grad();
  }
  // Compressed communication (fp16/bf16 hooks) cannot be exact: there the check is a relative
  // norm error below --norm-rtol, and above zero (the compression did happen).
  const bool lossy = args.count("norm-rtol") > 0;
  const double norm_rtol = std::stod(get(args, "norm-rtol", "0"));
  const auto named = model.named_parameters();
  const auto ref_named = ref_net->named_parameters();
  double worst = 0;
  std::string worst_name;
  for (const auto& item : named) {
    const auto& ref = ref_named[item.key()];
    const double rel = lossy ? ((item.value() - ref).norm() / ref.norm()).template item<double>()
                             : ((item.value() - ref).abs() / (ref.abs() + 1e-12)).max().template item<double>();
    if (rel > worst) {
      worst = rel;
      worst_name = item.key();
    }
    if (lossy ? rel > norm_rtol : !torch::allclose(item.value(), ref, rtol, 1e-9)) {
      return fail(ddp::str("parameter ", item.key(), " differs from single-process training: rel diff ", rel,
                           " > ", lossy ? norm_rtol : rtol));
    }
  }
  if (lossy && worst == 0) return fail("compressed communication gave exact results: was the hook applied?");
  const auto stats = model.stats();
  std::cout << "OK: world " << world << ", " << stats.bucket_bytes.size() << " buckets, max rel diff "
            << worst << " (" << worst_name << "), " << stats.iterations << " synced iterations\n";
  if (world > 1 && stats.iterations == 0) return fail("no synchronized iteration was recorded");
  return 0;
}

int train(const Args& args, ddp::ProcessGroup& pg) {
  const std::string model = get(args, "model", "mlp");
  // Each rank initialises differently: DDP must broadcast rank 0's parameters.
  const auto make = [&](auto factory, int seed) {
    torch::manual_seed(seed);
    auto net = factory();
    net->to(torch::kDouble);
    return net;
  };
  if (model == "mlp") {
    auto mlp = [] { return Mlp(); };
    return run_train(args, pg, make(mlp, 7 + pg.rank()), make(mlp, 7),
                     [](auto& m, const torch::Tensor& x, int) { return m(x); });
  }
  if (model == "cnn") {
    auto cnn = [] { return Cnn(); };
    return run_train(args, pg, make(cnn, 7 + pg.rank()), make(cnn, 7),
                     [](auto& m, const torch::Tensor& x, int) { return m(x); });
  }
  if (model == "shuffled") {
    auto shuffled = [] { return Shuffled(); };
    return run_train(args, pg, make(shuffled, 7 + pg.rank()), make(shuffled, 7),
                     [](auto& m, const torch::Tensor& x, int) { return m(x); });
  }
  if (model == "branchy") {
    auto branchy = [] { return Branchy(); };
    return run_train(args, pg, make(branchy, 7 + pg.rank()), make(branchy, 7),
                     [](auto& m, const torch::Tensor& x, int r) { return m(x, r % 2 == 0); });
  }
  return fail("unknown --model " + model);
}

// See Note [Dividing on the copy] (ddp/parallel/detail/reducer.cpp): the averaged gradient is
// PyTorch's, bit for bit. float32; only rank 0's loss counts (the others' is multiplied by 0), so the
// all-reduce adds exact zeros in whatever order and the result is rank 0's division alone:
// g * float(1 / n) where the gradient is copied into its bucket, g / n where it already is one
// (gradient_as_bucket_view, second step, zero_grad keeping the tensors). The two differ in the
// last bit for about a third of the elements at n = 3, so the check can tell them apart.
int average(const Args& args, ddp::ProcessGroup& pg) {
  const int world = pg.size(), rank = pg.rank();
  const bool view = args.count("grad-view") > 0;
  torch::manual_seed(11 + rank);  // DDP broadcasts rank 0's parameters
  torch::nn::Linear net(64, 256);
  torch::manual_seed(11);
  torch::nn::Linear reference(64, 256);  // rank 0's initial parameters, on every rank
  ddp::DdpOptions options;
  options.gradient_as_bucket_view = view;
  ddp::DistributedDataParallel<torch::nn::Linear> model(net, std::shared_ptr<ddp::ProcessGroup>(&pg, [](auto*) {}),
                                                        options);
  torch::manual_seed(5);
  const auto x = torch::randn({8, 64});  // rank 0's batch (every rank draws it; only rank 0's loss counts)
  for (int step = 0; step < 2; ++step) {
    // Step 2 under --grad-view keeps the gradients (zeroed in place): they are views into the buckets.
    for (auto& p : model.parameters()) {
      if (step == 1 && view) {
        p.mutable_grad().zero_();
      } else {
        p.mutable_grad() = torch::Tensor();
      }
    }
    for (auto& p : reference->parameters()) p.mutable_grad() = torch::Tensor();
    // --create-graph: backward records the gradients' own graph (higher-order use): DDP averages the
    // values all the same, as PyTorch does (it does not differentiate through the all-reduce).
    (model(x).pow(2).sum() * (rank == 0 ? 1.0 : 0.0)).backward({}, std::nullopt, args.count("create-graph") > 0);
    reference(x).pow(2).sum().backward();
    const bool divided_in_place = view && step == 1;
    long differing = 0, total = 0;
    const auto names = reference->named_parameters();
    const auto params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& g = names[i].value().grad();
      const auto multiplied = g * (1.0 / world), divided = g / world;
      const auto& expected = divided_in_place ? divided : multiplied;
      const auto& got = params[i].grad();
      if (!torch::equal(got, expected)) {
        return fail("step " + std::to_string(step + 1) + ": the averaged gradient of " + names[i].key() +
                    " is not PyTorch's " + (divided_in_place ? "g / n" : "g * (1 / n)") + " (max difference " +
                    std::to_string((got - expected).abs().max().item<double>()) + ")");
      }
      differing += multiplied.ne(divided).sum().item<long>();
      total += g.numel();
    }
    if (world == 3 && differing == 0) return fail("g * (1/3) and g / 3 agree everywhere: this check cannot tell them apart");
    std::cout << "OK: step " << step + 1 << " rank " << rank << ": " << (divided_in_place ? "g / n" : "g * (1 / n)")
              << " bit for bit (" << differing << " of " << total << " elements differ between the two)\n";
  }
  return 0;
}

// --- failure modes -------------------------------------------------------------------------------

// Without find_unused_parameters. Same usage on every rank: every rank fails naming never.*.
// --rank-dependent: only rank 1 skips `extra`; rank 1 fails naming extra.*, and rank 0 (which
// used everything) must not hang: its backward returns and the barrier after it completes.
int unused(const Args& args, ddp::ProcessGroup& pg) {
  const bool rank_dependent = args.count("rank-dependent") > 0;
  torch::manual_seed(1);
  ddp::DistributedDataParallel<Branchy> model(Branchy(), std::shared_ptr<ddp::ProcessGroup>(&pg, [](auto*) {}));
  auto x = torch::randn({4, 8});
  const bool use_extra = !rank_dependent || pg.rank() != 1;
  std::string what;
  try {
    auto out = model(x, use_extra);
    // never.* takes part with weight 0 in the rank-dependent case, so only extra.* is missing.
    auto loss = out.sum();
    if (rank_dependent) loss = loss + 0 * model.module()->never(out).sum();
    loss.backward();
  } catch (const std::exception& error) {
    what = error.what();
    std::cout << "expected error: " << what.substr(0, what.find('\n')) << "\n";
  }
  const std::string missing = rank_dependent ? "extra" : "never";
  const bool should_fail = !rank_dependent || pg.rank() == 1;
  pg.barrier(std::chrono::seconds(20));
  if (!should_fail) return what.empty() ? 0 : fail("rank 0 failed although it used every parameter: " + what);
  if (what.empty()) return fail("backward succeeded although " + missing + ".* got no gradient");
  if (contains(what, missing + ".weight") && contains(what, missing + ".bias") &&
      contains(what, "find_unused_parameters") && !contains(what, "fc1")) {
    return 0;
  }
  return fail("the error does not name exactly the unused parameters: " + what);
}

// Rank 0 alone evaluates (no grad) between training steps, a common pattern: no collective may be
// issued by that forward, or the ranks' collectives would pair up wrongly.
int eval_on_rank0(ddp::ProcessGroup& pg) {
  torch::manual_seed(3);
  ddp::DistributedDataParallel<Cnn> model(Cnn(), std::shared_ptr<ddp::ProcessGroup>(&pg, [](auto*) {}));
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1));
  auto x = torch::randn({4, 1, 8, 8});
  for (int step = 0; step < 3; ++step) {
    if (pg.rank() == 0) {
      torch::NoGradGuard no_grad;
      model.eval();
      model(x);
      model.train();
    }
    optimizer.zero_grad();
    model(x).square().mean().backward();
    optimizer.step();
  }
  for (auto& p : model.parameters()) {
    auto root = p.detach().clone();
    pg.broadcast(root, 0);
    if (!torch::equal(root, p.detach())) return fail("parameters diverged");
  }
  std::cout << "OK: rank " << pg.rank() << "\n";
  return 0;
}

int mismatch(ddp::ProcessGroup& pg) {
  try {
    ddp::DistributedDataParallel<Mlp> model(Mlp(pg.rank() == 1 ? 17 : 16),
                                            std::shared_ptr<ddp::ProcessGroup>(&pg, [](auto*) {}));
  } catch (const ddp::MismatchError& error) {
    const std::string what = error.what();
    std::cout << "expected error: " << what << "\n";
    if (contains(what, "rank 1") && contains(what, "fc1.weight") && contains(what, "[17, 8]")) return 0;
    return fail("the error does not name rank 1 and fc1.weight: " + what);
  }
  return fail("different models were accepted");
}

int expect_init_error(const Args& args, ddp::InitOptions options, const std::string& expected_type,
                      const std::vector<std::string>& parts) {
  options.timeout = std::chrono::milliseconds(get_int(args, "timeout-ms", 3000));
  // Joining has its own bound (Note [Waiting is never silent]): the same short one here.
  options.join_timeout = options.timeout;
  try {
    auto pg = ddp::init_process_group(options);
  } catch (const ddp::Error& error) {
    const std::string what = error.what();
    std::cout << "expected error: " << what << "\n";
    const bool right_type = (expected_type == "timeout" && dynamic_cast<const ddp::TimeoutError*>(&error)) ||
                            (expected_type == "communication" && dynamic_cast<const ddp::CommunicationError*>(&error)) ||
                            (expected_type == "mismatch" && dynamic_cast<const ddp::MismatchError*>(&error));
    if (!right_type) return fail("wrong error type for: " + what);
    for (const auto& part : parts) {
      if (!contains(what, part)) return fail("the error does not mention '" + part + "': " + what);
    }
    return 0;
  }
  return fail("init_process_group succeeded");
}

int collectives(const Args& args) {
  ddp::InitOptions options;
  // tcp / file rendezvous on the launcher's port (unique per run), with explicit rank and size.
  const std::string method = get(args, "init-method", "env");
  const std::string port = std::getenv("MASTER_PORT");
  if (method == "tcp") options.init_method = "tcp://127.0.0.1:" + port;
  if (method == "file") {
    const char* tmp = std::getenv("TMPDIR");
    options.init_method = std::string("file://") + (tmp ? tmp : "/tmp") + "/ddp_test_filestore_" + port;
  }
  if (method != "env") {
    options.rank = std::atoi(std::getenv("RANK"));
    options.world_size = std::atoi(std::getenv("WORLD_SIZE"));
  }
  options.timeout = std::chrono::seconds(20);
  auto pg = ddp::init_process_group(options);
  const int world = pg->size(), rank = pg->rank();
  auto t = torch::full({3}, static_cast<float>(rank + 1));
  pg->allreduce(t);
  if (t[0].item<float>() != world * (world + 1) / 2.0f) return fail("allreduce sum is wrong");
  auto b = torch::full({2}, static_cast<float>(rank + 10));
  pg->broadcast(b, world - 1);
  if (b[1].item<float>() != world - 1 + 10) return fail("broadcast is wrong");
  auto gathered = pg->allgather(torch::full({1}, static_cast<float>(rank)));
  for (int r = 0; r < world; ++r) {
    if (gathered[r].item<float>() != r) return fail("allgather is wrong");
  }
  // main_process_first: rank 0 creates a file the others then read.
  const std::string marker = get(args, "marker", "");
  if (!marker.empty()) {
    ddp::main_process_first(*pg, [&] {
      if (rank == 0) {
        std::ofstream(marker) << "ready";
      } else if (!std::ifstream(marker)) {
        throw ddp::Error("rank 0 had not created the file before the others ran");
      }
    });
  }
  pg->barrier();
  pg->destroy();
  std::cout << "OK: collectives on rank " << rank << " of " << world << "\n";
  return 0;
}

int worker_main(int argc, char** argv) {
  if (argc < 2) return fail("usage: ddp_test_worker <train|unused|mismatch|world|timeout|unreachable|collectives> [--options]");
  const std::string command = argv[1];
  const Args args = parse_args(argc, argv, 2);
  if (command == "collectives") return collectives(args);
  if (command == "fail") {
    if (std::string(std::getenv("RANK")) == "1") {
      throw ddp::CommunicationError("deliberate failure on rank 1 for the error-file test");
    }
    return 0;
  }
  if (command == "timeout") {
    // This rank is told the world has 2 ranks, but nobody else comes.
    ddp::InitOptions options;
    options.world_size = 2;
    return expect_init_error(args, options, "timeout", {"rank 1", "WORLD_SIZE=2"});
  }
  if (command == "unreachable") {
    ddp::InitOptions options;
    options.rank = 1;
    options.world_size = 2;
    return expect_init_error(args, options, "communication",
                             {"127.0.0.1:" + std::string(std::getenv("MASTER_PORT")), "could not reach"});
  }
  if (command == "world") {
    const char* rank = std::getenv("RANK");
    const bool liar = rank != nullptr && std::string(rank) == "1";
    ddp::InitOptions options;
    if (liar) options.world_size = 3;
    return expect_init_error(args, options, "mismatch", {"inconsistent world size", "WORLD_SIZE=3"});
  }
  ddp::InitOptions options;
  options.timeout = std::chrono::seconds(get_int(args, "timeout-s", 60));
  auto pg = ddp::init_process_group(options);
  if (command == "train") return train(args, *pg);
  if (command == "average") return average(args, *pg);
  if (command == "unused") return unused(args, *pg);
  if (command == "mismatch") return mismatch(*pg);
  if (command == "eval_on_rank0") return eval_on_rank0(*pg);
  return fail("unknown subcommand " + command);
}

}  // namespace

int main(int argc, char** argv) { return ddp::run_main(argc, argv, worker_main); }
