// Communication hooks (ddp/algorithms/comm.h), PowerSGD (ddp/algorithms/powersgd.h) and post-local SGD
// (ddp/algorithms/model_averaging.h) with in-process ranks (tests/ddp/in_process_group.h). Every figure is
// checked against a closed form: rank r's loss is sum_i <W_i, G_{r,i}> with G drawn from a
// generator seeded by (r, i), so rank r's gradient of W_i is G_{r,i} and the plain average is
// the mean over ranks, computed here independently of the library.
#include <catch2/catch.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ddp/algorithms/comm.h"
#include "ddp/algorithms/comm_hook_state.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/algorithms/model_averaging.h"
#include "ddp/algorithms/powersgd.h"
#include "tests/ddp/in_process_group.h"

namespace {

using ddp::testing::borrow;
using ddp::testing::run_ranks;
using Shapes = std::vector<std::vector<std::int64_t>>;

torch::Tensor drawn(std::uint64_t seed, const std::vector<std::int64_t>& shape) {
  auto generator = at::detail::createCPUGenerator(seed);
  return torch::randn(shape, generator, torch::TensorOptions().dtype(torch::kDouble));
}

// Rank r's gradient of parameter i in iteration t.
torch::Tensor local_gradient(int rank, std::size_t i, int t, const std::vector<std::int64_t>& shape) {
  return drawn(1000 * static_cast<std::uint64_t>(t) + 10 * static_cast<std::uint64_t>(rank) + i, shape);
}

torch::Tensor mean_gradient(int world, std::size_t i, int t, const std::vector<std::int64_t>& shape) {
  auto sum = torch::zeros(shape, torch::kDouble);
  for (int r = 0; r < world; ++r) sum += local_gradient(r, i, t, shape);
  return sum / world;
}

struct MatrixSumImpl : torch::nn::Module {
  explicit MatrixSumImpl(const Shapes& shapes) : shapes(shapes) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      params.push_back(register_parameter("w" + std::to_string(i), torch::zeros(shapes[i], torch::kDouble)));
    }
  }
  torch::Tensor forward(int rank, int t) {
    auto loss = torch::zeros({}, torch::kDouble);
    for (std::size_t i = 0; i < params.size(); ++i) loss = loss + (params[i] * local_gradient(rank, i, t, shapes[i])).sum();
    return loss;
  }
  Shapes shapes;
  std::vector<torch::Tensor> params;
};
TORCH_MODULE(MatrixSum);
using Ddp = ddp::DistributedDataParallel<MatrixSum>;

// max |grad_i - expected_i|.
double worst_difference(const MatrixSum& net, const std::vector<torch::Tensor>& expected) {
  double worst = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto& grad = net->params[i].grad();
    if (!grad.defined()) return 1e9;
    worst = std::max(worst, (grad - expected[i]).abs().max().item<double>());
  }
  return worst;
}

std::vector<torch::Tensor> means(int world, const Shapes& shapes, int t) {
  std::vector<torch::Tensor> out;
  for (std::size_t i = 0; i < shapes.size(); ++i) out.push_back(mean_gradient(world, i, t, shapes[i]));
  return out;
}

// A user's hook: sums without dividing, and records what it was handed.
class SumHook : public ddp::CommHookInterface {
 public:
  struct Seen {
    std::size_t index;
    bool last;
    std::vector<std::int64_t> offsets;
    std::vector<std::int64_t> numels;
    std::int64_t buffer_numel;
    bool views_share_buffer;
  };
  std::string name() const override { return "sum"; }
  ddp::HookWork run(ddp::ProcessGroup& group, ddp::GradBucket& bucket) override {
    Seen s{bucket.index, bucket.last, bucket.offsets, {}, bucket.buffer.numel(), true};
    for (std::size_t k = 0; k < bucket.gradients.size(); ++k) {
      s.numels.push_back(bucket.parameters[k].numel());
      const auto* start = static_cast<const char*>(bucket.buffer.data_ptr()) +
                          bucket.offsets[k] * static_cast<std::int64_t>(bucket.buffer.element_size());
      s.views_share_buffer = s.views_share_buffer && bucket.gradients[k].data_ptr() == start &&
                             bucket.gradients[k].sizes() == bucket.parameters[k].sizes();
    }
    seen.push_back(s);
    auto work = group.allreduce_async(bucket.buffer, "gradient all-reduce", static_cast<int>(bucket.index));
    return ddp::HookWork(group, {work}, "gradient all-reduce", [buffer = bucket.buffer] { return buffer; });
  }
  std::vector<Seen> seen;
};

}  // namespace

TEST_CASE("hooks: a user's hook gets every bucket with its layout and owns the division", "[hooks]") {
  const Shapes shapes{{3, 4}, {5}, {2, 2}};
  struct Result {
    double error = 0;
    std::vector<SumHook::Seen> seen;
    std::size_t buckets = 0;
  };
  const auto results = run_ranks<Result>(3, [&](ddp::ProcessGroup& group) {
    MatrixSum net(shapes);
    ddp::DdpOptions options;
    options.bucket_cap_bytes = options.first_bucket_cap_bytes = 1;  // a bucket per parameter
    Ddp model(net, borrow(group), options);
    auto hook = std::make_shared<SumHook>();
    model.register_comm_hook(hook);
    model(group.rank(), 0).backward();
    Result r;
    auto expected = means(3, shapes, 0);
    for (auto& e : expected) e = e * 3;  // the sum: the hook does not divide
    r.error = worst_difference(net, expected);
    r.seen = hook->seen;
    r.buckets = model.bucket_parameter_names().size();
    return r;
  });
  for (const auto& r : results) {
    REQUIRE(r.error <= 1e-12);
    REQUIRE(r.buckets == 3);
    REQUIRE(r.seen.size() == 3);
    for (std::size_t k = 0; k < r.seen.size(); ++k) {
      CAPTURE(k);
      REQUIRE(r.seen[k].index == k);
      REQUIRE(r.seen[k].last == (k + 1 == r.seen.size()));
      REQUIRE(r.seen[k].offsets == std::vector<std::int64_t>{0});
      REQUIRE(r.seen[k].numels.size() == 1);
      REQUIRE(r.seen[k].buffer_numel == r.seen[k].numels[0]);
      REQUIRE(r.seen[k].views_share_buffer);
    }
  }
}

TEST_CASE("hooks: registering is refused when null, twice, or after a synchronized backward", "[hooks]") {
  const auto messages = run_ranks<std::vector<std::string>>(2, [&](ddp::ProcessGroup& group) {
    std::vector<std::string> out;
    const auto attempt = [&](Ddp& model, std::shared_ptr<ddp::CommHookInterface> hook) {
      try {
        model.register_comm_hook(std::move(hook));
        out.push_back("accepted");
      } catch (const ddp::InvalidArgument& error) {
        out.push_back(error.what());
      }
    };
    MatrixSum net(Shapes{{2, 2}});
    Ddp model(net, borrow(group));
    attempt(model, nullptr);
    attempt(model, ddp::make_comm_hook(ddp::CommHook::kFp16Compress));
    attempt(model, ddp::make_comm_hook(ddp::CommHook::kBf16Compress));
    MatrixSum other(Shapes{{2, 2}});
    Ddp late(other, borrow(group));
    late(group.rank(), 0).backward();
    attempt(late, std::make_shared<SumHook>());
    return out;
  });
  for (const auto& m : messages) {
    REQUIRE(m.size() == 4);
    REQUIRE_THAT(m[0], Catch::Contains("the hook is null"));
    REQUIRE(m[1] == "accepted");
    REQUIRE_THAT(m[2], Catch::Contains("'fp16_compress') is already registered"));
    REQUIRE_THAT(m[3], Catch::Contains("before the first synchronized backward"));
  }
}

TEST_CASE("hooks: the built-in all-reduce registered by hand is bit for bit the default", "[hooks]") {
  const Shapes shapes{{7, 3}, {11}};
  const auto results = run_ranks<std::vector<torch::Tensor>>(3, [&](ddp::ProcessGroup& group) {
    std::vector<torch::Tensor> grads;
    for (bool registered : {false, true}) {
      MatrixSum net(shapes);
      Ddp model(net, borrow(group));
      if (registered) model.register_comm_hook(ddp::make_comm_hook(ddp::CommHook::kAllreduce));
      model(group.rank(), 0).backward();
      for (auto& p : net->params) grads.push_back(p.grad().clone());
    }
    return grads;
  });
  for (const auto& g : results) {
    REQUIRE(g.size() == 4);
    REQUIRE(torch::equal(g[0], g[2]));
    REQUIRE(torch::equal(g[1], g[3]));
  }
}

namespace {

// Runs `iterations` synchronized iterations of MatrixSum(shapes) with `hook` on `world` ranks and
// returns, per rank, each iteration's gradients, plus the hook's error buffers before and after.
struct PowerSgdRun {
  std::vector<std::vector<torch::Tensor>> grads;  // [iteration][parameter]
  std::vector<torch::Tensor> errors;              // bucket 0's error after each iteration (undefined before any)
  std::int64_t before = 0, after = 0;
  std::vector<std::size_t> bucket_order;  // parameter indices in the (single) bucket, after the rebuild
};

std::vector<PowerSgdRun> run_powersgd(int world, const Shapes& shapes, const ddp::PowerSgdOptions& options,
                                      int iterations) {
  return run_ranks<PowerSgdRun>(world, [&](ddp::ProcessGroup& group) {
    MatrixSum net(shapes);
    ddp::DdpOptions ddp_options;
    ddp_options.bucket_cap_bytes = ddp_options.first_bucket_cap_bytes = std::size_t{1} << 30;  // one bucket
    Ddp model(net, borrow(group), ddp_options);
    auto hook = std::make_shared<ddp::PowerSgdHook>(options);
    model.register_comm_hook(hook);
    PowerSgdRun run;
    for (int t = 0; t < iterations; ++t) {
      for (auto& p : net->params) p.mutable_grad() = torch::Tensor();
      model(group.rank(), t).backward();
      run.grads.emplace_back();
      for (auto& p : net->params) run.grads.back().push_back(p.grad().clone());
      auto error = hook->error(0);
      run.errors.push_back(error.defined() ? error.clone() : error);
    }
    const auto buckets = model.bucket_parameter_names();
    for (const auto& name : buckets.at(0)) run.bucket_order.push_back(std::stoul(name.substr(1)));
    run.before = hook->numel_before_compression();
    run.after = hook->numel_after_compression();
    return run;
  });
}

}  // namespace

TEST_CASE("powersgd: at full rank it is the all-reduce average", "[hooks]") {
  const Shapes shapes{{6, 4}, {3, 2, 2}, {5}};
  ddp::PowerSgdOptions options;
  options.matrix_approximation_rank = 8;  // >= min(n, m) of every matrix
  options.min_compression_rate = 0;        // compress even where it does not pay
  options.start_powersgd_iter = 2;
  for (bool warm : {true, false}) {
    CAPTURE(warm);
    options.warm_start = warm;
    const auto runs = run_powersgd(2, shapes, options, 4);
    for (const auto& run : runs) {
      for (int t = 0; t < 4; ++t) {
        CAPTURE(t);
        // Error feedback adds the previous remainder, which is 0 up to rounding at full rank.
        auto expected = means(2, shapes, t);
        for (std::size_t i = 0; i < shapes.size(); ++i) REQUIRE(torch::allclose(run.grads[t][i], expected[i], 1e-9, 1e-9));
      }
      REQUIRE(run.before > 0);  // the two matrices went through compression
    }
  }
}

TEST_CASE("powersgd: error feedback keeps what compression lost; 1-D tensors are exact", "[hooks]") {
  const Shapes shapes{{16, 12}, {12}, {8, 3, 3}};
  ddp::PowerSgdOptions options;
  options.matrix_approximation_rank = 1;
  options.start_powersgd_iter = 2;
  const int world = 2, iterations = 5;
  const auto runs = run_powersgd(world, shapes, options, iterations);
  for (int r = 0; r < world; ++r) {
    const auto& run = runs[static_cast<std::size_t>(r)];
    CAPTURE(r);
    for (int t = 0; t < iterations; ++t) {
      CAPTURE(t);
      const auto expected = means(world, shapes, t);
      // The bias (1-D) is all-reduced as it is, in every iteration.
      REQUIRE(torch::allclose(run.grads[t][1], expected[1], 1e-12, 1e-12));
      if (t < options.start_powersgd_iter) {
        REQUIRE(torch::allclose(run.grads[t][0], expected[0], 1e-12, 1e-12));
        REQUIRE_FALSE(run.errors[t].defined());
        continue;
      }
      // Compressed: not the average, but a rank-1 matrix...
      REQUIRE((run.grads[t][0] - expected[0]).abs().max().item<double>() > 1e-3);
      REQUIRE(torch::linalg_matrix_rank(run.grads[t][0]).item<std::int64_t>() == 1);
      // ...the same on every rank...
      REQUIRE(torch::equal(run.grads[t][0], runs[0].grads[t][0]));
      // ...and the invariant: new error = (local gradient + old error) - result, element by element
      // of the bucket (the parameters in its order).
      torch::Tensor old_error = t == options.start_powersgd_iter ? torch::zeros_like(run.errors[t]) : run.errors[t - 1];
      std::vector<torch::Tensor> local, result;
      for (auto i : run.bucket_order) {
        local.push_back(local_gradient(r, i, t, shapes[i]).reshape({-1}));
        result.push_back(run.grads[t][i].reshape({-1}));
      }
      REQUIRE(torch::allclose(run.errors[t], torch::cat(local) + old_error - torch::cat(result), 1e-12, 1e-12));
      REQUIRE(run.errors[t].abs().max().item<double>() > 1e-3);
    }
    // 16x12 -> (16+12)*1, 8x9 -> (8+9)*1 per compressed iteration; the bias is not counted as compressed.
    REQUIRE(run.after < run.before);
  }
}

TEST_CASE("powersgd: the hook's state in a checkpoint resumes the run bit for bit", "[hooks]") {
  const Shapes shapes{{16, 12}, {12}};
  ddp::PowerSgdOptions options;
  options.start_powersgd_iter = 2;
  const auto folder = std::filesystem::temp_directory_path() / ("ddp_hook_state_" + std::to_string(::getpid()));
  std::filesystem::create_directories(folder);
  struct Result {
    std::vector<torch::Tensor> straight, resumed, fresh;  // gradients of iterations 3 and 4
    bool file = false, loaded = false;
  };
  const auto results = run_ranks<Result>(2, [&](ddp::ProcessGroup& group) {
    Result result;
    // run(from, to, load): iterations from..to-1 on a new module and hook, the hook's state loaded
    // first when `load`, saved at the end; returns the last two iterations' gradient of w0.
    const auto run = [&](int from, int to, bool load, bool save) {
      MatrixSum net(shapes);
      Ddp model(net, borrow(group));
      auto hook = std::make_shared<ddp::PowerSgdHook>(options);
      model.register_comm_hook(hook);
      if (load) result.loaded = ddp::load_comm_hook_state(model.comm_hook(), folder, group.rank());
      std::vector<torch::Tensor> grads;
      for (int t = from; t < to; ++t) {
        net->params[0].mutable_grad() = torch::Tensor();
        net->params[1].mutable_grad() = torch::Tensor();
        model(group.rank(), t).backward();
        if (t >= 3) grads.push_back(net->params[0].grad().clone());
      }
      if (save) ddp::save_comm_hook_state(model.comm_hook(), folder, group.rank());
      return grads;
    };
    result.straight = run(0, 5, false, false);
    run(0, 3, false, true);
    group.barrier();
    result.file = std::filesystem::exists(ddp::comm_hook_state_file(folder, group.rank()));
    result.resumed = run(3, 5, true, false);
    result.fresh = run(3, 5, false, false);
    return result;
  });
  std::filesystem::remove_all(folder);
  for (const auto& r : results) {
    REQUIRE(r.file);
    REQUIRE(r.loaded);
    REQUIRE(r.straight.size() == 2);
    REQUIRE(r.resumed.size() == 2);
    for (std::size_t k = 0; k < 2; ++k) {
      REQUIRE(torch::equal(r.resumed[k], r.straight[k]));
      REQUIRE_FALSE(torch::allclose(r.fresh[k], r.straight[k]));  // without the state it is another run
    }
  }
}
