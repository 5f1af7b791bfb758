// Unit tests of the torch-free (or nearly) pieces: bucket assignment, environment and init-method
// parsing, the error file of run_main, communication hook names.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "ddp/parallel/detail/bucket.h"
#include "ddp/algorithms/default_comm_hooks.h"
#include "ddp/base/worker_variables.h"
#include "ddp/base/error.h"
#include "ddp/runtime/run_main.h"
#include "tests/support/env_of.h"

using ddp::testing::env_of;

namespace {

using Buckets = std::vector<std::vector<std::size_t>>;
const c10::Device kCpu(c10::DeviceType::CPU);
constexpr auto kFloat = c10::ScalarType::Float;

Buckets assign(const std::vector<std::size_t>& sizes, std::size_t first, std::size_t cap,
               std::vector<c10::ScalarType> dtypes = {}, std::vector<c10::Device> devices = {}) {
  if (dtypes.empty()) dtypes.assign(sizes.size(), kFloat);
  if (devices.empty()) devices.assign(sizes.size(), kCpu);
  return ddp::detail::compute_bucket_assignment(sizes, dtypes, devices, ddp::detail::BucketCaps{first, cap});
}

// Every index exactly once.
void require_partition(const Buckets& buckets, std::size_t n) {
  std::multiset<std::size_t> seen;
  for (const auto& b : buckets) seen.insert(b.begin(), b.end());
  REQUIRE(seen.size() == n);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(seen.count(i) == 1);
}

}  // namespace

TEST_CASE("buckets: reverse order, small first bucket, then the cap") {
  // 6 parameters of 400 bytes; first cap 800, cap 1200.
  const auto buckets = assign(std::vector<std::size_t>(6, 400), 800, 1200);
  REQUIRE(buckets == Buckets{{5, 4}, {3, 2, 1}, {0}});
}

TEST_CASE("buckets: defaults are 1 MiB first and 25 MiB after") {
  const ddp::detail::BucketCaps caps;
  REQUIRE(caps.first_bucket_bytes == (1u << 20));
  REQUIRE(caps.bucket_bytes == (25u << 20));
  // 30 parameters of 1 MiB: [29], then 25 of them, then the remaining 4.
  const auto buckets = ddp::detail::compute_bucket_assignment(std::vector<std::size_t>(30, 1u << 20),
                                                      std::vector<c10::ScalarType>(30, kFloat),
                                                      std::vector<c10::Device>(30, kCpu));
  REQUIRE(buckets.size() == 3);
  REQUIRE(buckets[0] == std::vector<std::size_t>{29});
  REQUIRE(buckets[1].size() == 25);
  REQUIRE(buckets[1].front() == 28);
  REQUIRE(buckets[2] == std::vector<std::size_t>{3, 2, 1, 0});
}

TEST_CASE("buckets: zero-size parameters are assigned and add no bytes") {
  const auto buckets = assign({0, 100, 0, 0}, 100, 100);
  require_partition(buckets, 4);
  REQUIRE(buckets == Buckets{{3, 2, 1}, {0}});
}

TEST_CASE("buckets: a parameter larger than the cap gets a bucket of its own") {
  const auto buckets = assign({10, 10, 5000, 10, 10}, 20, 100);
  REQUIRE(buckets == Buckets{{4, 3}, {2}, {1, 0}});
}

TEST_CASE("buckets: one bucket when the cap is unbounded, one per parameter when tiny") {
  REQUIRE(assign({4, 8, 12}, SIZE_MAX, SIZE_MAX) == Buckets{{2, 1, 0}});
  REQUIRE(assign({4, 8, 12}, 1, 1) == Buckets{{2}, {1}, {0}});
}

TEST_CASE("buckets: one dtype and one device per bucket") {
  const auto d = c10::ScalarType::Double;
  const auto buckets = assign({4, 8, 4, 8, 4}, 1000, 1000, {kFloat, d, kFloat, d, kFloat});
  require_partition(buckets, 5);
  REQUIRE(buckets.size() == 2);
  for (const auto& b : buckets) {
    for (auto i : b) REQUIRE((i % 2) == (b.front() % 2));  // same dtype as its first member
  }
  // Ready order: the bucket whose earliest parameter comes last in registration is first.
  REQUIRE(buckets[0] == std::vector<std::size_t>{3, 1});
  REQUIRE(buckets[1] == std::vector<std::size_t>{4, 2, 0});

  const c10::Device gpu0(c10::DeviceType::CUDA, 0), gpu1(c10::DeviceType::CUDA, 1);
  const auto by_device = assign({4, 4, 4}, 1000, 1000, {}, {gpu0, gpu1, gpu0});
  REQUIRE(by_device == Buckets{{1}, {2, 0}});
}

TEST_CASE("buckets: dtype switches close nothing early and caps count per dtype") {
  const auto d = c10::ScalarType::Double;
  // Doubles fill their own buckets with their own first cap.
  const auto buckets = assign({100, 100, 100, 100}, 150, 150, {d, kFloat, d, kFloat});
  REQUIRE(buckets == Buckets{{3, 1}, {2, 0}});
}

TEST_CASE("buckets: bad input is rejected") {
  REQUIRE_THROWS_AS(ddp::detail::compute_bucket_assignment({1, 2}, {kFloat}, {kCpu, kCpu}), ddp::InvalidArgument);
  REQUIRE_THROWS_AS(assign({1}, 0, 10), ddp::InvalidArgument);
  REQUIRE(assign({}, 10, 10).empty());
}

// See Note [Bucket rebuild]: the assignment walks a given gradient-ready order.
Buckets assign_in_order(const std::vector<std::size_t>& sizes, std::size_t first, std::size_t cap,
                        const std::vector<std::size_t>& order, std::vector<c10::ScalarType> dtypes = {}) {
  if (dtypes.empty()) dtypes.assign(sizes.size(), kFloat);
  return ddp::detail::compute_bucket_assignment(sizes, dtypes, std::vector<c10::Device>(sizes.size(), kCpu),
                                        ddp::detail::BucketCaps{first, cap}, order);
}

TEST_CASE("buckets: an explicit ready order is walked instead of reverse registration") {
  // 6 parameters of 400 bytes, ready in registration order 0..5: the same caps as above group them
  // from the first registered on.
  const std::vector<std::size_t> forward{0, 1, 2, 3, 4, 5};
  REQUIRE(assign_in_order(std::vector<std::size_t>(6, 400), 800, 1200, forward) == Buckets{{0, 1}, {2, 3, 4}, {5}});
  // Reverse registration given explicitly equals the default.
  const std::vector<std::size_t> reverse{5, 4, 3, 2, 1, 0};
  REQUIRE(assign_in_order(std::vector<std::size_t>(6, 400), 800, 1200, reverse) ==
          assign(std::vector<std::size_t>(6, 400), 800, 1200));
  // An interleaved order (a head registered first but ready first): buckets follow it exactly.
  const std::vector<std::size_t> interleaved{4, 5, 0, 1, 2, 3};
  REQUIRE(assign_in_order({8, 8, 8, 8, 8, 8}, 16, 16, interleaved) == Buckets{{4, 5}, {0, 1}, {2, 3}});
  REQUIRE(assign_in_order({8, 8, 8, 8, 8, 8}, 1, 1, interleaved) == Buckets{{4}, {5}, {0}, {1}, {2}, {3}});
}

TEST_CASE("buckets: with a ready order, dtypes still split buckets and launch order follows readiness") {
  const auto d = c10::ScalarType::Double;
  // Ready order 0, 1, 2, 3 with dtypes float, double, float, double and room for everything: the
  // float bucket {0, 2} completes at position 2, before the double bucket {1, 3} at position 3.
  const auto buckets = assign_in_order({4, 8, 4, 8}, 1000, 1000, {0, 1, 2, 3}, {kFloat, d, kFloat, d});
  REQUIRE(buckets == Buckets{{0, 2}, {1, 3}});
  require_partition(buckets, 4);
}

TEST_CASE("buckets: a ready order that is not a permutation is rejected") {
  REQUIRE_THROWS_AS(assign_in_order({4, 4, 4}, 10, 10, {0, 1}), ddp::InvalidArgument);        // too short
  REQUIRE_THROWS_AS(assign_in_order({4, 4, 4}, 10, 10, {0, 1, 1}), ddp::InvalidArgument);     // repeated
  REQUIRE_THROWS_AS(assign_in_order({4, 4, 4}, 10, 10, {0, 1, 3}), ddp::InvalidArgument);     // out of range
  REQUIRE_THROWS_WITH(assign_in_order({4, 4, 4}, 10, 10, {2, 2, 0}),
                      Catch::Contains("not a permutation") && Catch::Contains("entry 1 is 2"));
}

TEST_CASE("environment: torchrun variables") {
  const auto env = ddp::parse_worker_environment(env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                                         {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node7"},
                                                         {"MASTER_PORT", "29500"}}));
  REQUIRE(env.rank == 3);
  REQUIRE(env.world_size == 8);
  REQUIRE(env.local_rank == 1);
  REQUIRE(env.local_world_size == 2);
  REQUIRE(env.master_addr == "node7");
  REQUIRE(env.master_port == 29500);
  REQUIRE(env.source == "torchrun");
}

TEST_CASE("environment: Slurm fallback and explicit overrides") {
  const auto env = ddp::parse_worker_environment(env_of({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"},
                                                         {"SLURM_LOCALID", "2"}, {"MASTER_ADDR", "a"},
                                                         {"MASTER_PORT", "1234"}}));
  REQUIRE(env.rank == 5);
  REQUIRE(env.world_size == 6);
  REQUIRE(env.local_rank == 2);
  REQUIRE(env.source == "slurm");
  const auto overridden = ddp::parse_worker_environment(
      env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}), 1, 2);
  REQUIRE(overridden.rank == 1);
  REQUIRE(overridden.world_size == 2);
}

TEST_CASE("environment: errors name the variable and say what to do") {
  const auto message = [](std::map<std::string, std::string> values) {
    try {
      ddp::parse_worker_environment(env_of(std::move(values)));
    } catch (const ddp::InvalidArgument& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  REQUIRE_THAT(message({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}),
               Catch::Contains("RANK is not set") && Catch::Contains("ddp_launch"));
  REQUIRE_THAT(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}), Catch::Contains("MASTER_ADDR"));
  REQUIRE_THAT(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}), Catch::Contains("MASTER_PORT"));
  REQUIRE_THAT(message({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}),
               Catch::Contains("RANK=2 is not below WORLD_SIZE=2"));
  REQUIRE_THAT(message({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}),
               Catch::Contains("RANK='x'"));
  REQUIRE_THAT(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}}),
               Catch::Contains("MASTER_PORT='70000'"));
}

TEST_CASE("init methods") {
  using Kind = ddp::InitMethod::Kind;
  REQUIRE(ddp::parse_init_method("env://").kind == Kind::kEnv);
  const auto tcp = ddp::parse_init_method("tcp://10.0.0.1:23456");
  REQUIRE(tcp.kind == Kind::kTcp);
  REQUIRE(tcp.host == "10.0.0.1");
  REQUIRE(tcp.port == 23456);
  const auto v6 = ddp::parse_init_method("tcp://[::1]:80");
  REQUIRE(v6.host == "::1");
  REQUIRE(v6.port == 80);
  const auto file = ddp::parse_init_method("file:///tmp/rendezvous");
  REQUIRE(file.kind == Kind::kFile);
  REQUIRE(file.path == "/tmp/rendezvous");
  REQUIRE_THROWS_AS(ddp::parse_init_method("tcp://host"), ddp::InvalidArgument);
  REQUIRE_THROWS_AS(ddp::parse_init_method("tcp://:12"), ddp::InvalidArgument);
  REQUIRE_THROWS_AS(ddp::parse_init_method("file://relative"), ddp::InvalidArgument);
  REQUIRE_THROWS_WITH(ddp::parse_init_method("http://x"), Catch::Contains("unknown scheme"));
}

TEST_CASE("run_main: returns main's code, or writes torchrun's error file and returns 1") {
  char name[] = "prog";
  char* argv[] = {name, nullptr};
  REQUIRE(ddp::run_main(1, argv, [](int, char**) { return 7; }) == 7);

  const std::string path = "test_ddp_units_error_file.json";
  std::remove(path.c_str());
  setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  const int code = ddp::run_main(1, argv, [](int, char**) -> int {
    throw ddp::TimeoutError("waited 2 s for \"rank 1\"");
  });
  unsetenv("TORCHELASTIC_ERROR_FILE");
  REQUIRE(code == 1);
  std::ifstream in(path);
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  REQUIRE_THAT(text.str(), Catch::StartsWith("{\"message\": {\"message\": \"waited 2 s for \\\"rank 1\\\"\", "
                                             "\"extraInfo\": {\"py_callstack\": \"ddp::TimeoutError: waited"));
  REQUIRE_THAT(text.str(), Catch::Contains("\"timestamp\": \""));
  std::remove(path.c_str());
}

TEST_CASE("error file JSON escapes control characters") {
  const auto json = ddp::error_file_json("T", "a\nb\\c\x01", 5);
  REQUIRE(json == "{\"message\": {\"message\": \"a\\nb\\\\c\\u0001\", \"extraInfo\": {\"py_callstack\": "
                  "\"T: a\\nb\\\\c\\u0001\", \"timestamp\": \"5\"}}}\n");
}

TEST_CASE("communication hooks") {
  REQUIRE(ddp::parse_comm_hook("fp16") == ddp::CommHook::kFp16Compress);
  REQUIRE(ddp::parse_comm_hook("bf16_compress") == ddp::CommHook::kBf16Compress);
  REQUIRE_FALSE(ddp::parse_comm_hook("int8").has_value());
  REQUIRE(ddp::wire_dtype(ddp::CommHook::kFp16Compress, kFloat) == c10::ScalarType::Half);
  REQUIRE(ddp::wire_dtype(ddp::CommHook::kBf16Compress, c10::ScalarType::Double) == c10::ScalarType::BFloat16);
  REQUIRE_FALSE(ddp::wire_dtype(ddp::CommHook::kAllreduce, kFloat).has_value());
  REQUIRE_FALSE(ddp::wire_dtype(ddp::CommHook::kFp16Compress, c10::ScalarType::Long).has_value());
}
