// DiLoCo (ddp/algorithms/diloco.h) against closed forms and references this test computes, with
// in-process ranks: the fragment plan, the int8 codec's bound, H = 1 against DDP, Nesterov outer
// steps, the streaming schedule with overlap, low-precision exchanges and the state.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include "ddp/algorithms/detail/diloco_plan.h"
#include "ddp/algorithms/diloco.h"
#include "ddp/algorithms/model_averaging.h"
#include "ddp/base/error.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "tests/ddp/in_process_group.h"

namespace {

using ddp::testing::borrow;
using ddp::testing::run_ranks;

// Parameters whose gradient is a constant of the rank: rank r's gradient of parameter i is
// (r + 1) (i + 1) everywhere, so each inner SGD step moves them by lr times that and the test can
// compute every outer step itself.
struct ConstantGradients {
  std::vector<torch::Tensor> params;
  ConstantGradients(int count, std::int64_t numel) {
    for (int i = 0; i < count; ++i) params.push_back(torch::full({numel}, 1.0 + i, torch::kFloat).requires_grad_(true));
  }
  void backward(int rank) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = torch::full_like(params[i], (rank + 1.0) * (static_cast<double>(i) + 1.0));
    }
  }
};

// Normal values from a generator of this thread's own (the default generator is shared by the
// ranks' threads).
torch::Tensor normal(std::vector<std::int64_t> sizes, std::uint64_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, generator, torch::TensorOptions().dtype(torch::kFloat));
}

}  // namespace

TEST_CASE("DiLoCo fragments: contiguous runs of about equal size, one parameter each at least", "[diloco]") {
  CHECK(ddp::detail::diloco_fragments({10, 10, 10, 10}, 2) == std::vector<int>{0, 0, 1, 1});
  CHECK(ddp::detail::diloco_fragments({100, 1, 1, 1}, 3) == std::vector<int>{0, 1, 2, 2});
  CHECK(ddp::detail::diloco_fragments({1, 1, 1, 100}, 2) == std::vector<int>{0, 0, 0, 1});
  CHECK(ddp::detail::diloco_fragments({5, 5, 5}, 3) == std::vector<int>{0, 1, 2});
  CHECK(ddp::detail::diloco_fragments({5, 5, 5}, 1) == std::vector<int>{0, 0, 0});
  CHECK_THROWS_AS(ddp::detail::diloco_fragments({5, 5}, 3), ddp::InvalidArgument);
  // torchft's schedule: H = 12, F = 3: fragment f at 4 (f + 1) + 12 k.
  std::vector<std::vector<std::int64_t>> sends(3);
  for (std::int64_t s = 0; s <= 30; ++s) {
    for (int f = 0; f < 3; ++f) {
      if (ddp::detail::diloco_sends_at(12, 3, f, s)) sends[static_cast<std::size_t>(f)].push_back(s);
    }
  }
  CHECK(sends[0] == std::vector<std::int64_t>{4, 16, 28});
  CHECK(sends[1] == std::vector<std::int64_t>{8, 20});
  CHECK(sends[2] == std::vector<std::int64_t>{12, 24});
}

TEST_CASE("int8 outer gradients: every value within half its block's scale", "[diloco]") {
  torch::manual_seed(3);
  const std::int64_t block = 64, n = 1000;  // 16 blocks, the last one short
  std::vector<torch::Tensor> payloads, values;
  for (int r = 0; r < 3; ++r) {
    values.push_back(torch::randn({n}) * (r + 1) * torch::linspace(0.01, 10, n));
    payloads.push_back(ddp::detail::encode_int8(values.back(), block));
    REQUIRE(payloads.back().numel() == n + 4 * 16);
  }
  const auto mean = ddp::detail::decode_int8_mean(torch::cat(payloads), 3, n, block);
  const auto exact = (values[0] + values[1] + values[2]) / 3;
  // Bound: the mean over the ranks of max |x| / 254 of each value's block.
  torch::Tensor bound = torch::zeros({n});
  for (const auto& v : values) {
    const auto padded = torch::constant_pad_nd(v, {0, 16 * block - n}).view({16, block});
    bound += (padded.abs().amax(1) / 254).repeat_interleave(block).narrow(0, 0, n) / 3;
  }
  CHECK(((mean - exact).abs() <= bound * (1 + 1e-5) + 1e-7).all().item<bool>());
  CHECK((mean - exact).abs().max().item<double>() > 0);  // int8 really rounds
  // All zeros: scale 0, decoded exactly.
  const auto zeros = ddp::detail::encode_int8(torch::zeros({10}), block);
  CHECK(torch::equal(ddp::detail::decode_int8_mean(zeros, 1, 10, block), torch::zeros({10})));
}

TEST_CASE("DiLoCo with H = 1, outer lr 1 and no momentum is DDP with an all-reduce each step", "[diloco]") {
  const int world = 3, steps = 5;
  const auto run = [&](bool diloco) {
    return run_ranks<torch::Tensor>(world, [&](ddp::ProcessGroup& group) {
      torch::nn::Linear net(4, 2);
      {
        torch::NoGradGuard no_grad;
        net->weight.copy_(normal({2, 4}, 7));
        net->bias.copy_(normal({2}, 8));
      }
      torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
      ddp::DistributedDataParallel<torch::nn::Linear> model(net, borrow(group));
      std::unique_ptr<ddp::DiLoCo> outer;
      if (diloco) {
        model.register_comm_hook(std::make_shared<ddp::PostLocalSgdHook>(ddp::PostLocalSgdOptions{}));
        ddp::DiLoCoOptions options;
        options.sync_every = 1;
        options.outer_lr = 1;
        options.outer_momentum = 0;
        outer = std::make_unique<ddp::DiLoCo>(borrow(group), sgd, options);
      }
      for (int t = 0; t < steps; ++t) {
        sgd.zero_grad();
        const auto x = normal({8, 4}, static_cast<std::uint64_t>(100 * t + group.rank()));
        torch::mse_loss(model(x), torch::ones({8, 2})).backward();
        if (outer) {
          outer->step();
        } else {
          sgd.step();
        }
      }
      return torch::cat({net->weight.detach().reshape(-1), net->bias.detach().reshape(-1)});
    });
  };
  const auto with_ddp = run(false);
  const auto with_diloco = run(true);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(torch::equal(with_diloco[static_cast<std::size_t>(r)], with_diloco[0]));
    // Equal up to the order of float additions (the mean of updates, not of gradients).
    CHECK(torch::allclose(with_diloco[static_cast<std::size_t>(r)], with_ddp[0], 1e-5, 1e-6));
  }
}

TEST_CASE("DiLoCo's outer steps against a reference: Nesterov momentum, fragments, overlap, alpha", "[diloco]") {
  struct Case {
    std::int64_t H, F, tau;
    double alpha;
    bool nesterov;
  };
  const std::vector<Case> cases{{3, 1, 0, 0.0, true}, {4, 2, 1, 0.0, true}, {6, 3, 1, 0.5, false}, {4, 2, 0, 0.25, true}};
  for (const auto& c : cases) {
    CAPTURE(c.H, c.F, c.tau, c.alpha, c.nesterov);
    const int world = 2, params = 3, steps = 13;
    const double lr = 0.1, outer_lr = 0.7, mu = 0.9;
    ddp::DiLoCoOptions options;
    options.sync_every = c.H;
    options.fragments = c.F;
    options.sync_delay = c.tau;
    options.update_alpha = c.alpha;
    options.nesterov = c.nesterov;
    options.outer_lr = outer_lr;
    options.outer_momentum = mu;
    struct Seen {
      std::vector<double> local, global_after_finish;
      std::int64_t outer_steps = 0;
      std::vector<int> fragment_of;
    };
    const auto seen = run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
      ConstantGradients model(params, 5);
      torch::optim::SGD sgd(model.params, torch::optim::SGDOptions(lr));
      ddp::DiLoCo diloco(borrow(group), sgd, options);
      Seen out;
      for (int t = 0; t < steps; ++t) {
        model.backward(group.rank());
        diloco.step();
      }
      for (const auto& p : model.params) out.local.push_back(p[0].item<double>());
      out.outer_steps = diloco.outer_steps();
      out.fragment_of = diloco.fragment_of_parameter();
      diloco.finish();
      for (const auto& p : model.params) out.global_after_finish.push_back(p[0].item<double>());
      return out;
    });
    // The reference, step by step.
    const auto& fragment_of = seen[0].fragment_of;
    std::vector<std::vector<double>> x(world, std::vector<double>(params));
    std::vector<double> g(params), b(params, 0), in_flight(params, 0);
    std::vector<bool> has_b(params, false);
    std::vector<std::int64_t> sent_at(static_cast<std::size_t>(c.F), -1), last_send(static_cast<std::size_t>(c.F), 0);
    for (int i = 0; i < params; ++i) {
      g[i] = 1.0 + i;
      for (int r = 0; r < world; ++r) x[r][i] = g[i];
    }
    std::int64_t outer_steps = 0;
    const auto apply = [&](int f) {
      for (int i = 0; i < params; ++i) {
        if (fragment_of[static_cast<std::size_t>(i)] != f) continue;
        const double d = in_flight[i];
        b[i] = has_b[i] ? mu * b[i] + d : d;
        has_b[i] = true;
        g[i] -= outer_lr * (c.nesterov ? d + mu * b[i] : b[i]);
        for (int r = 0; r < world; ++r) x[r][i] = c.alpha * x[r][i] + (1 - c.alpha) * g[i];
      }
      sent_at[static_cast<std::size_t>(f)] = -1;
      ++outer_steps;
    };
    const auto send = [&](int f, std::int64_t s) {
      for (int i = 0; i < params; ++i) {
        if (fragment_of[static_cast<std::size_t>(i)] != f) continue;
        double sum = 0;
        for (int r = 0; r < world; ++r) sum += g[i] - x[r][i];
        in_flight[i] = sum / world;
      }
      sent_at[static_cast<std::size_t>(f)] = s;
      last_send[static_cast<std::size_t>(f)] = s;
    };
    for (std::int64_t s = 1; s <= steps; ++s) {
      for (int r = 0; r < world; ++r) {
        for (int i = 0; i < params; ++i) x[r][i] -= lr * (r + 1.0) * (i + 1.0);
      }
      for (int f = 0; f < c.F; ++f) {
        const std::int64_t offset = c.H * (f + 1) / c.F;
        if (s >= offset && (s - offset) % c.H == 0) send(f, s);
      }
      for (int f = 0; f < c.F; ++f) {
        if (sent_at[static_cast<std::size_t>(f)] >= 0 && s >= sent_at[static_cast<std::size_t>(f)] + c.tau) apply(f);
      }
    }
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      REQUIRE(seen[static_cast<std::size_t>(r)].outer_steps == outer_steps);
      for (int i = 0; i < params; ++i) {
        CAPTURE(i);
        CHECK(seen[static_cast<std::size_t>(r)].local[static_cast<std::size_t>(i)] == Approx(x[r][i]).epsilon(1e-5));
      }
    }
    REQUIRE(outer_steps > 0);
    // finish(): every fragment not in flight and not sent at the last step is sent, then every one in
    // flight applied; all ranks then hold g.
    for (int f = 0; f < c.F; ++f) {
      if (sent_at[static_cast<std::size_t>(f)] < 0 && last_send[static_cast<std::size_t>(f)] != steps) send(f, steps);
    }
    for (int f = 0; f < c.F; ++f) {
      if (sent_at[static_cast<std::size_t>(f)] >= 0) apply(f);
    }
    for (int r = 0; r < world; ++r) {
      for (int i = 0; i < params; ++i) {
        CAPTURE(r, i);
        CHECK(seen[static_cast<std::size_t>(r)].global_after_finish[static_cast<std::size_t>(i)] == Approx(g[i]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("DiLoCo in bf16, fp16 and int8: the outer step within the codec's bound, fewer bytes", "[diloco]") {
  for (const auto dtype : {ddp::OuterDtype::kFloat32, ddp::OuterDtype::kBFloat16, ddp::OuterDtype::kFloat16,
                           ddp::OuterDtype::kInt8}) {
    CAPTURE(ddp::outer_dtype_name(dtype));
    const int world = 2;
    const std::int64_t numel = 10000;
    struct Seen {
      double error = 0;
      std::int64_t bytes = 0;
    };
    const auto seen = run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
      auto p = normal({numel}, 11).requires_grad_(true);  // the same initial values on both ranks
      const auto initial = p.detach().clone();
      torch::optim::SGD sgd({p}, torch::optim::SGDOptions(1));
      ddp::DiLoCoOptions options;
      options.sync_every = 1;
      options.outer_lr = 1;
      options.outer_momentum = 0;
      options.outer_dtype = dtype;
      ddp::DiLoCo diloco(borrow(group), sgd, options);
      const auto g0 = normal({numel}, 20), g1 = normal({numel}, 21);
      p.mutable_grad() = group.rank() == 0 ? g0 : g1;
      diloco.step();  // g = the mean of the ranks' x = initial - mean gradient
      Seen out;
      const auto largest = std::max(g0.abs().max().item<double>(), g1.abs().max().item<double>());
      out.error = (p.detach() - (initial - (g0 + g1) / 2)).abs().max().item<double>() / largest;
      out.bytes = diloco.bytes_sent();
      return out;
    });
    // Relative to the largest outer gradient: fp32 exact up to rounding; bf16 8 bits of mantissa, fp16 11,
    // each with a rounding at the send and at each of the ring's additions; int8 1 / 254 per rank.
    const double bound = dtype == ddp::OuterDtype::kFloat32    ? 1e-6
                         : dtype == ddp::OuterDtype::kBFloat16 ? 3 * 0.00390625
                         : dtype == ddp::OuterDtype::kFloat16  ? 3 * 0.00048828125
                                                               : 1.0 / 254 + 1e-6;
    const std::int64_t bytes = dtype == ddp::OuterDtype::kFloat32 ? 4 * numel
                               : dtype == ddp::OuterDtype::kInt8  ? numel + 4 * ((numel + ddp::kOuterInt8Block - 1) / ddp::kOuterInt8Block)
                                                                  : 2 * numel;
    for (int r = 0; r < world; ++r) {
      CHECK(seen[static_cast<std::size_t>(r)].error <= bound);
      CHECK(seen[static_cast<std::size_t>(r)].bytes == bytes);
    }
  }
}

TEST_CASE("DiLoCo's state: a copy loaded elsewhere continues bit for bit; mismatches refused", "[diloco]") {
  const int world = 2;
  struct Seen {
    bool same_state = false, same_params = false, pending_saved = false, refused = false;
    std::int64_t outer_steps = 0;
  };
  const auto seen = run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
    ddp::DiLoCoOptions options;
    options.sync_every = 4;
    options.fragments = 2;
    options.sync_delay = 1;
    ConstantGradients a(2, 3), b(2, 3);
    torch::optim::SGD sgd_a(a.params, torch::optim::SGDOptions(0.1));
    torch::optim::SGD sgd_b(b.params, torch::optim::SGDOptions(0.1));
    ddp::DiLoCo first(borrow(group), sgd_a, options);
    // Fragment 0 sent after step 2, applied after 3; fragment 1 sent after 4, applied after 5.
    for (int t = 0; t < 5; ++t) {
      a.backward(group.rank());
      first.step();
    }
    ddp::DiLoCo second(borrow(group), sgd_b, options);
    second.load_state(first.state());
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < a.params.size(); ++i) b.params[i].copy_(a.params[i]);
    }
    Seen out;
    for (int t = 0; t < 5; ++t) {
      a.backward(group.rank());
      first.step();
      b.backward(group.rank());
      second.step();
      if (t == 0) out.pending_saved = first.state()["pending.0"].item<std::int64_t>() == 1;  // sent after step 6
    }
    const auto sa = first.state(), sb = second.state();
    out.same_state = sa.size() == sb.size();
    for (const auto& item : sa) out.same_state = out.same_state && torch::equal(item.value(), sb[item.key()]);
    out.same_params = torch::equal(a.params[0], b.params[0]) && torch::equal(a.params[1], b.params[1]);
    out.outer_steps = second.outer_steps();
    ddp::DiLoCoOptions other = options;
    other.fragments = 1;
    ddp::DiLoCo third(borrow(group), sgd_b, other);
    try {
      third.load_state(first.state());
    } catch (const ddp::InvalidArgument&) {
      out.refused = true;
    }
    return out;
  });
  for (const auto& out : seen) {
    CHECK(out.same_state);
    CHECK(out.same_params);
    CHECK(out.pending_saved);
    CHECK(out.outer_steps == 4);  // after steps 3, 5, 7 and 9
    CHECK(out.refused);
  }
}

TEST_CASE("DiLoCo refuses bad options in one line", "[diloco]") {
  const auto errors = run_ranks<std::string>(1, [](ddp::ProcessGroup& group) -> std::string {
    ConstantGradients model(2, 1);
    torch::optim::SGD sgd(model.params, torch::optim::SGDOptions(0.1));
    std::string out;
    for (auto change : std::vector<std::function<void(ddp::DiLoCoOptions&)>>{
             [](auto& o) { o.sync_every = 0; }, [](auto& o) { o.fragments = 3; },
             [](auto& o) { o.sync_every = 4, o.fragments = 2, o.sync_delay = 2; }, [](auto& o) { o.update_alpha = 2; },
             [](auto& o) { o.outer_momentum = 1; }}) {
      ddp::DiLoCoOptions options;
      change(options);
      try {
        ddp::DiLoCo diloco(borrow(group), sgd, options);
        out += "accepted;";
      } catch (const ddp::InvalidArgument& error) {
        out += std::string(error.what()).find('\n') == std::string::npos ? "refused;" : "multi-line;";
      }
    }
    return out;
  });
  CHECK(errors[0] == "refused;refused;refused;refused;refused;");
  CHECK_THROWS_AS(ddp::parse_outer_dtype("fp8"), ddp::UsageError);
}
