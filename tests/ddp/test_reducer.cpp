// Unit tests of DistributedDataParallel's core (ddp/parallel/detail/reducer.h) with in-process ranks: one thread per
// rank over a HashStore (tests/ddp/in_process_group.h), real Gloo all-reduces, no processes.
// Every figure is checked against a closed form: rank r's loss is (r + 1) * sum_i <p_i, c_i>, so
// parameter i's local gradient is (r + 1) * c_i and its average over W ranks is (W + 1) / 2 * c_i.
// The ddp_launch-driven tests (ddp.equivalence_*, ddp.join_*, ...) stay as integration tests.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/parallel/detail/bucket.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "tests/ddp/in_process_group.h"

namespace {

using ddp::testing::borrow;
using ddp::testing::run_ranks;
using Names = std::vector<std::vector<std::string>>;

// Parameters p0, p1, ... of the given element counts (0 allowed), registered in that order. forward
// computes scale * sum_i <p_i, c_i> over the parameters `used` lists, in the order `use_order`
// gives (default: registration order), with c_i = coefficients(i, numel).
torch::Tensor coefficients(std::size_t i, std::int64_t numel) {
  return torch::arange(numel, torch::kDouble) * 0.25 + static_cast<double>(i + 1);
}

struct LinearSumImpl : torch::nn::Module {
  explicit LinearSumImpl(const std::vector<std::int64_t>& sizes) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      params.push_back(register_parameter("p" + std::to_string(i), torch::zeros({sizes[i]}, torch::kDouble)));
      coefficient.push_back(coefficients(i, sizes[i]));
      use_order.push_back(i);
    }
  }
  torch::Tensor forward(double scale) {
    auto loss = torch::zeros({}, torch::kDouble);
    for (auto i : use_order) {
      if (i < unused_from) loss = loss + (params[i] * coefficient[i]).sum();
    }
    return loss * scale;
  }
  std::vector<torch::Tensor> params, coefficient;
  std::vector<std::size_t> use_order;
  std::size_t unused_from = SIZE_MAX;  // parameters from this index on take no part in the loss
};
TORCH_MODULE(LinearSum);

using Ddp = ddp::DistributedDataParallel<LinearSum>;

double mean_scale(int world) { return (world + 1) / 2.0; }  // the mean of 1..W

// max |grad_i - factor * c_i| over every parameter; -1 when a gradient is missing or misshapen.
double gradient_error(const LinearSum& net, double factor) {
  double worst = 0;
  for (std::size_t i = 0; i < net->params.size(); ++i) {
    const auto& grad = net->params[i].grad();
    if (!grad.defined() || grad.sizes() != net->params[i].sizes()) return -1;
    if (grad.numel() > 0) worst = std::max(worst, (grad - factor * net->coefficient[i]).abs().max().item<double>());
  }
  return worst;
}

void zero_grads(LinearSum& net) {
  for (auto& p : net->params) p.mutable_grad() = torch::Tensor();
}

std::int64_t count_gradient_allreduces(const ddp::ProcessGroup& group, std::vector<int>* buckets = nullptr) {
  std::int64_t n = 0;
  for (const auto& record : group.recent_collectives()) {
    if (std::string(record.what) != "gradient all-reduce") continue;
    ++n;
    if (buckets != nullptr) buckets->push_back(record.bucket);
  }
  return n;
}

const std::vector<std::vector<std::int64_t>> kSizes = {{0}, {1}, {0, 3}, {5, 0, 7}, {1000, 1, 0, 300}};

}  // namespace

TEST_CASE("reducer: the averaged gradient is the mean over ranks, for every size and bucket cap", "[reducer]") {
  for (int world : {1, 2, 3}) {
    for (const auto& sizes : kSizes) {
      for (std::size_t cap : {std::size_t{1}, std::size_t{64}, SIZE_MAX}) {
        CAPTURE(world, sizes, cap);
        struct Seen {
          double error = 0;
          Names buckets;
          std::size_t bucket_bytes = 0;
          std::int64_t allreduces = 0;
          std::vector<int> launch_order;
        };
        const auto seen = run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
          LinearSum net(sizes);
          ddp::DdpOptions options;
          options.bucket_cap_bytes = cap;
          options.first_bucket_cap_bytes = cap;
          Ddp model(net, borrow(group), options);
          model(static_cast<double>(group.rank() + 1)).backward();
          Seen s;
          s.error = gradient_error(net, world == 1 ? 1.0 : mean_scale(world));
          s.buckets = model.bucket_parameter_names();
          for (auto bytes : model.stats().bucket_bytes) s.bucket_bytes += bytes;
          s.allreduces = count_gradient_allreduces(group, &s.launch_order);
          return s;
        });
        std::size_t total = 0;
        for (auto n : sizes) total += static_cast<std::size_t>(n) * sizeof(double);
        // Closed form of the layout: unbounded caps give one bucket in reverse registration order;
        // 1-byte caps close a bucket after each non-empty parameter (an empty one joins the next).
        Names expected;
        if (cap == SIZE_MAX) {
          expected.emplace_back();
          for (std::size_t i = sizes.size(); i-- > 0;) expected.back().push_back("p" + std::to_string(i));
        } else if (cap == 1) {
          expected.emplace_back();
          for (std::size_t i = sizes.size(); i-- > 0;) {
            expected.back().push_back("p" + std::to_string(i));
            if (sizes[i] > 0 && i > 0) expected.emplace_back();
          }
        }
        for (int r = 0; r < world; ++r) {
          const auto& s = seen[static_cast<std::size_t>(r)];
          CAPTURE(r);
          REQUIRE(s.error >= 0);
          REQUIRE(s.error <= 1e-12);
          REQUIRE(s.bucket_bytes == total);
          if (!expected.empty()) REQUIRE(s.buckets == expected);
          REQUIRE(s.buckets == seen[0].buckets);
          // One all-reduce per bucket, launched strictly in bucket order (world size 1 sends none).
          REQUIRE(s.allreduces == (world == 1 ? 0 : static_cast<std::int64_t>(s.buckets.size())));
          for (std::size_t k = 0; k < s.launch_order.size(); ++k) REQUIRE(s.launch_order[k] == static_cast<int>(k));
        }
      }
    }
  }
}

TEST_CASE("reducer: buckets are rebuilt once in the order gradients became ready", "[reducer]") {
  // Used last-registered first, so backward readies p0 first: the opposite of the initial layout.
  const std::vector<std::int64_t> sizes{4, 3, 2, 5};
  for (int world : {1, 2, 3}) {
    for (bool rebuild : {true, false}) {
      CAPTURE(world, rebuild);
      struct Seen {
        Names before, after;
        double error = 0;
      };
      const auto seen = run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
        LinearSum net(sizes);
        net->use_order = {3, 2, 1, 0};
        ddp::DdpOptions options;
        options.bucket_cap_bytes = 1;
        options.first_bucket_cap_bytes = 1;
        options.rebuild_buckets = rebuild;
        Ddp model(net, borrow(group), options);
        Seen s;
        s.before = model.bucket_parameter_names();
        for (int step = 0; step < 3; ++step) {
          zero_grads(net);
          model(static_cast<double>(group.rank() + 1)).backward();
        }
        s.after = model.bucket_parameter_names();
        s.error = gradient_error(net, world == 1 ? 1.0 : mean_scale(world));
        return s;
      });
      const Names registration_reversed{{"p3"}, {"p2"}, {"p1"}, {"p0"}};
      const Names ready_order{{"p0"}, {"p1"}, {"p2"}, {"p3"}};
      for (const auto& s : seen) {
        REQUIRE(s.before == registration_reversed);
        // Rebuilt only with more than one rank (nothing to overlap at world size 1) and when asked.
        REQUIRE(s.after == (rebuild && world > 1 ? ready_order : registration_reversed));
        REQUIRE(s.error >= 0);
        REQUIRE(s.error <= 1e-12);
      }
    }
  }
}

TEST_CASE("reducer: no_sync accumulates locally, the next synchronized backward averages the sum", "[reducer]") {
  const std::vector<std::int64_t> sizes{6, 0, 2};
  constexpr int kMicroBatches = 3;  // two under no_sync, then one synchronized
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    struct Seen {
      std::int64_t collectives_during_no_sync = -1;
      double error = 0;
    };
    const auto seen = run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
      LinearSum net(sizes);
      Ddp model(net, borrow(group));
      Seen s;
      const auto before = group.last_collective_seq();
      {
        auto guard = model.no_sync();
        for (int m = 1; m < kMicroBatches; ++m) model(static_cast<double>((group.rank() + 1) * m)).backward();
      }
      s.collectives_during_no_sync = group.last_collective_seq() - before;
      model(static_cast<double>((group.rank() + 1) * kMicroBatches)).backward();
      // sum over micro-batches m of mean over ranks of (r + 1) * m.
      const double sum_m = kMicroBatches * (kMicroBatches + 1) / 2.0;
      s.error = gradient_error(net, (world == 1 ? 1.0 : mean_scale(world)) * sum_m);
      return s;
    });
    for (const auto& s : seen) {
      REQUIRE(s.collectives_during_no_sync == 0);
      REQUIRE(s.error >= 0);
      REQUIRE(s.error <= 1e-12);
    }
  }
}

TEST_CASE("reducer: a parameter without a gradient fails backward on every rank, naming it", "[reducer]") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto messages = run_ranks<std::string>(world, [&](ddp::ProcessGroup& group) {
      LinearSum net(std::vector<std::int64_t>{3, 2, 4});
      net->unused_from = 2;  // p2 takes no part in the loss
      Ddp model(net, borrow(group));
      try {
        model(1.0).backward();
      } catch (const std::exception& error) {
        return std::string(error.what());
      }
      return std::string("no error");
    });
    for (const auto& message : messages) {
      REQUIRE_THAT(message, Catch::Contains("1 parameter(s) got no gradient: p2") &&
                                Catch::Contains("find_unused_parameters"));
    }
  }
}

TEST_CASE("reducer: find_unused_parameters averages what some ranks used and leaves the unused alone", "[reducer]") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    struct Seen {
      double used_error = 0, partly_error = 0;
      bool never_has_grad = true;
    };
    const auto seen = run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
      LinearSum net(std::vector<std::int64_t>{3, 2, 4});
      ddp::DdpOptions options;
      options.find_unused_parameters = true;
      // p0 used everywhere, p1 by rank 0 only, p2 nowhere.
      net->unused_from = group.rank() == 0 ? 2 : 1;
      Ddp model(net, borrow(group), options);
      Seen s;
      for (int step = 0; step < 2; ++step) {
        zero_grads(net);
        model(static_cast<double>(group.rank() + 1)).backward();
      }
      const double average = world == 1 ? 1.0 : mean_scale(world);
      s.used_error = (net->params[0].grad() - average * net->coefficient[0]).abs().max().item<double>();
      // Only rank 0 (scale 1) contributed; the others added zeros: 1 / W.
      const auto& partly = net->params[1].grad();
      s.partly_error = partly.defined() ? (partly - net->coefficient[1] / world).abs().max().item<double>() : -1;
      s.never_has_grad = net->params[2].grad().defined();
      return s;
    });
    for (const auto& s : seen) {
      REQUIRE(s.used_error <= 1e-12);
      REQUIRE(s.partly_error >= 0);
      REQUIRE(s.partly_error <= 1e-12);
      REQUIRE_FALSE(s.never_has_grad);
    }
  }
}

TEST_CASE("reducer: join with uneven inputs matches the closed form on every rank", "[reducer]") {
  // Rank r runs r + 1 steps of p -= lr * grad. In step i the ranks r >= i train, the others have
  // joined and contribute zeros: the average is sum_{r >= i} (r + 1) / D_i * c, with D_i the world
  // size (divide_by_initial_world_size) or the number of ranks still training.
  const std::vector<std::int64_t> sizes{3, 0, 2};
  constexpr double kLr = 0.5;
  for (int world : {1, 2, 3}) {
    for (bool by_initial : {true, false}) {
      CAPTURE(world, by_initial);
      const auto finals = run_ranks<std::vector<torch::Tensor>>(world, [&](ddp::ProcessGroup& group) {
        LinearSum net(sizes);
        Ddp model(net, borrow(group));
        ddp::JoinOptions join;
        join.divide_by_initial_world_size = by_initial;
        model.join(
            [&] {
              for (int step = 0; step <= group.rank(); ++step) {
                zero_grads(net);
                model(static_cast<double>(group.rank() + 1)).backward();
                torch::NoGradGuard no_grad;
                for (auto& p : net->params) p.sub_(kLr * p.grad());
              }
            },
            join);
        std::vector<torch::Tensor> out;
        for (const auto& p : net->params) out.push_back(p.detach().clone());
        return out;
      });
      double factor = 0;  // sum over steps of the averaged scale
      for (int i = 0; i < world; ++i) {
        double sum = 0;
        for (int r = i; r < world; ++r) sum += r + 1;
        factor += world == 1 ? sum : sum / (by_initial ? world : world - i);
      }
      for (const auto& params : finals) {
        REQUIRE(params.size() == sizes.size());
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const auto expected = -kLr * factor * coefficients(i, sizes[i]);
          REQUIRE(params[i].sizes() == expected.sizes());
          if (sizes[i] > 0) REQUIRE((params[i] - expected).abs().max().item<double>() <= 1e-12);
        }
      }
    }
  }
}

TEST_CASE("reducer: gradient_as_bucket_view averages in the bucket and keeps param.grad there", "[reducer]") {
  const std::vector<std::int64_t> sizes{4, 0, 3, 6};
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    struct Seen {
      double error = 0;
      bool grads_stay = false, shared = false;
    };
    const auto seen = run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
      LinearSum net(sizes);
      ddp::DdpOptions options;
      options.gradient_as_bucket_view = true;
      // 40-byte caps: buckets [p3] (48 bytes) and [p2, p1, p0] (56 bytes), before and after the rebuild.
      options.bucket_cap_bytes = 40;
      options.first_bucket_cap_bytes = 40;
      Ddp model(net, borrow(group), options);
      Seen s;
      std::vector<const void*> previous;
      for (int step = 0; step < 3; ++step) {
        // Zeroed in place, as optimizer.zero_grad(set_to_none=false) does: the views stay.
        for (auto& p : net->params) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
        model(static_cast<double>(group.rank() + 1)).backward();
        std::vector<const void*> now;
        for (auto& p : net->params) now.push_back(p.grad().storage().data());
        // Once the layout is final (a rebuild happens before step 1 at most), param.grad stays put.
        if (step == 2) s.grads_stay = now == previous;
        previous = now;
      }
      const auto storage = [&](std::size_t i) { return net->params[i].grad().storage().data(); };
      s.shared = storage(0) == storage(2) && storage(0) != storage(3);
      s.error = gradient_error(net, world == 1 ? 1.0 : mean_scale(world));
      return s;
    });
    for (const auto& s : seen) {
      REQUIRE(s.error >= 0);
      REQUIRE(s.error <= 1e-12);
      REQUIRE(s.grads_stay);
      // The gradients of one bucket are views into one flat tensor; at world size 1 nothing is
      // synchronized and autograd's own gradients stay.
      REQUIRE(s.shared == (world > 1));
    }
  }
}

TEST_CASE("reducer: fp16 and bf16 compression hooks average within their precision", "[reducer]") {
  const std::vector<std::int64_t> sizes{5, 0, 3};
  for (auto hook : {ddp::CommHook::kFp16Compress, ddp::CommHook::kBf16Compress}) {
    for (int world : {2, 3}) {
      CAPTURE(ddp::to_string(hook), world);
      const auto errors = run_ranks<double>(world, [&](ddp::ProcessGroup& group) {
        LinearSum net(sizes);
        ddp::DdpOptions options;
        options.comm_hook = hook;
        Ddp model(net, borrow(group), options);
        model(static_cast<double>(group.rank() + 1)).backward();
        return gradient_error(net, mean_scale(world));
      });
      // The largest gradient is (W + 1) / 2 * 4.0; float16 and bfloat16 keep 11 and 8 bits.
      const double tolerance = hook == ddp::CommHook::kFp16Compress ? 1e-2 : 5e-2;
      for (double error : errors) {
        REQUIRE(error >= 0);
        REQUIRE(error <= tolerance);
      }
    }
  }
}

TEST_CASE("reducer: a model that differs between ranks fails on every rank, naming the difference", "[reducer]") {
  const auto messages = run_ranks<std::string>(3, [&](ddp::ProcessGroup& group) {
    LinearSum net(group.rank() == 1 ? std::vector<std::int64_t>{3, 4} : std::vector<std::int64_t>{3, 2});
    try {
      Ddp model(net, borrow(group));
    } catch (const ddp::MismatchError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  });
  for (const auto& message : messages) {
    REQUIRE_THAT(message, Catch::Contains("on rank 1") && Catch::Contains("'p1' shape [4]") &&
                              Catch::Contains("'p1' shape [2]"));
  }
}

TEST_CASE("new_process_group rejects a bad rank, size or backend with one line", "[reducer]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  REQUIRE_THROWS_WITH(ddp::new_process_group(store, 2, 2), Catch::Contains("need 0 <= rank < world_size"));
  REQUIRE_THROWS_WITH(ddp::new_process_group(nullptr, 0, 1), Catch::Contains("the store is null"));
  ddp::StoreGroupOptions nccl;
  nccl.backend = "nccl";
  REQUIRE_THROWS_AS(ddp::new_process_group(store, 0, 1, nccl), ddp::InvalidArgument);
}
