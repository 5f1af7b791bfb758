// Sliced all-reduce (Note [Sliced all-reduce] in ddp/distributed/detail/sliced_allreduce.cpp): the slicing against its
// closed form, and sliced all-reduces over in-process ranks (tests/ddp/in_process_group.h) across
// world sizes, sizes (0 included), dtypes and reduce ops against the exact results; the auto choice,
// the environment variable, one collective record per all-reduce, and a bounded wait.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ddp/base/worker_variables.h"
#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"
#include "ddp/distributed/detail/sliced_allreduce.h"
#include "tests/ddp/in_process_group.h"

namespace {

using ddp::detail::allreduce_slices;
using ddp::detail::Slice;

// Rank r's element i: (r + 1) * 1000 + i, exact in float32 for these sizes.
torch::Tensor offset_input_of(int rank, std::int64_t numel, torch::Dtype dtype) {
  return torch::arange(numel, torch::kDouble).add((rank + 1) * 1000.0).to(dtype);
}

// The exact result over n ranks: the sum, or the maximum (rank n - 1's value).
torch::Tensor expected_of(int n, std::int64_t numel, torch::Dtype dtype, c10d::ReduceOp op) {
  const torch::Tensor index = torch::arange(numel, torch::kDouble);
  if (op == c10d::ReduceOp::MAX) return index.add(n * 1000.0).to(dtype);
  return index.mul(n).add(1000.0 * n * (n + 1) / 2.0).to(dtype);
}

}  // namespace

TEST_CASE("allreduce_slices: min(ceil(bytes / slice), numel) slices in order, sizes within one element",
          "[sliced]") {
  for (const std::int64_t numel : {0, 1, 2, 3, 7, 10, 1000, 262144, 262145, 1 << 20}) {
    for (const std::int64_t element_size : {1, 2, 4, 8}) {
      for (const std::int64_t slice_bytes : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1}, std::int64_t{3},
                                             std::int64_t{4}, std::int64_t{64}, std::int64_t{1000},
                                             std::int64_t{1} << 20}) {
        CAPTURE(numel, element_size, slice_bytes);
        const std::vector<Slice> slices = allreduce_slices(numel, element_size, slice_bytes);
        const std::int64_t bytes = numel * element_size;
        const std::int64_t expected_count =
            (slice_bytes <= 0 || bytes <= slice_bytes || numel == 0)
                ? 1
                : std::min((bytes + slice_bytes - 1) / slice_bytes, numel);
        REQUIRE(static_cast<std::int64_t>(slices.size()) == expected_count);
        std::int64_t next = 0;
        bool contiguous = true, nonempty = true, even = true;
        for (const Slice& slice : slices) {
          contiguous = contiguous && slice.offset == next;
          nonempty = nonempty && (slice.numel > 0 || numel == 0);
          even = even && slice.numel <= slices.front().numel && slice.numel >= slices.front().numel - 1;
          next += slice.numel;
        }
        CHECK(contiguous);
        CHECK(nonempty);
        CHECK(even);
        CHECK(next == numel);
        // No slice is larger than the slice size by more than one element.
        if (slices.size() > 1) CHECK(slices.front().numel * element_size <= slice_bytes + element_size);
      }
    }
  }
}

// With 16-byte slices (2-4 elements: 250-500 slices of one all-reduce in flight at once) every wait
// of the group runs through hundreds of slices' waits: this test is what found the race of Note [A
// work that completes as its wait gives up] (ddp/distributed/detail/collective_wait.cpp).
TEST_CASE("sliced all-reduce: exact results across world sizes, sizes, dtypes and ops", "[sliced]") {
  // 2-4 elements a slice, up to 500 slices in flight.
  constexpr std::int64_t kSliceBytes = 16;
  for (const int world : {2, 3, 4}) {
    for (const torch::Dtype dtype : {torch::kFloat, torch::kDouble}) {
      CAPTURE(world, dtype);
      // Per rank, per case: whether the result was right, whether it was sliced, the records it made.
      struct Seen {
        std::vector<std::string> wrong;
        int sliced = 0;
        int unsliced = 0;
        bool one_record_each = true;
      };
      const auto seen = ddp::testing::run_ranks<Seen>(world, [&](ddp::ProcessGroup& group) {
        Seen s;
        group.set_allreduce_slice_bytes(kSliceBytes);
        for (const std::int64_t numel : {0, 1, 3, 4, 5, 64, 1001}) {
          for (const c10d::ReduceOp::RedOpType op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX}) {
            const std::string name = std::to_string(numel) + (op == c10d::ReduceOp::MAX ? " max" : " sum");
            const torch::Tensor expected = expected_of(world, numel, dtype, op);
            // Blocking.
            torch::Tensor blocking = offset_input_of(group.rank(), numel, dtype);
            const auto before = group.last_collective_seq();
            group.allreduce(blocking, op, "test");
            s.one_record_each = s.one_record_each && group.last_collective_seq() == before + 1;
            if (!torch::equal(blocking, expected)) s.wrong.push_back("blocking " + name);
            // Asynchronous, with an op.
            torch::Tensor async = offset_input_of(group.rank(), numel, dtype);
            auto work = group.allreduce_async(async, op, "test async");
            const bool sliced = dynamic_cast<ddp::detail::SlicedWork*>(work.get()) != nullptr;
            (sliced ? s.sliced : s.unsliced) += 1;
            if (sliced != (numel * static_cast<std::int64_t>(c10::elementSize(dtype)) > kSliceBytes)) {
              s.wrong.push_back("sliced or not against the size: " + name);
            }
            group.wait(work, "test async");
            try {  // (no Catch2 assertion on a rank's thread)
              work->getFuture()->wait();
            } catch (const std::exception& error) {
              s.wrong.push_back("future of " + name + ": " + error.what());
            }
            if (!work->isCompleted() || work->exception()) s.wrong.push_back("not completed: " + name);
            if (!torch::equal(async, expected)) s.wrong.push_back("async " + name);
            if (sliced && (work->result().size() != 1 || !work->result()[0].is_same(async))) {
              s.wrong.push_back("result() is not the tensor: " + name);
            }
          }
          // The DDP bucket form (sum), and a non-contiguous tensor (all-reduced unsliced, still right).
          torch::Tensor bucket = offset_input_of(group.rank(), numel, dtype);
          group.wait(group.allreduce_async(bucket, "bucket", 0), "bucket");
          if (!torch::equal(bucket, expected_of(world, numel, dtype, c10d::ReduceOp::SUM))) {
            s.wrong.push_back("bucket " + std::to_string(numel));
          }
          torch::Tensor strided = offset_input_of(group.rank(), 2 * numel, dtype).view({-1, 2}).t();
          group.allreduce(strided);
          if (!torch::equal(strided, expected_of(world, 2 * numel, dtype, c10d::ReduceOp::SUM).view({-1, 2}).t())) {
            s.wrong.push_back("non-contiguous " + std::to_string(numel));
          }
        }
        return s;
      });
      for (int rank = 0; rank < world; ++rank) {
        CAPTURE(rank);
        const Seen& s = seen[static_cast<std::size_t>(rank)];
        CHECK(s.wrong == std::vector<std::string>{});
        CHECK(s.sliced > 0);
        CHECK(s.unsliced > 0);
        CHECK(s.one_record_each);
      }
    }
  }
}

TEST_CASE("sliced all-reduce: a rank that never arrives gives a TimeoutError within the group's timeout",
          "[sliced]") {
  using namespace std::chrono_literals;
  const auto started = std::chrono::steady_clock::now();
  const auto outcome = ddp::testing::run_ranks<std::string>(
      2,
      [](ddp::ProcessGroup& group) -> std::string {
        group.set_allreduce_slice_bytes(64);
        if (group.rank() == 1) {  // stays (its group open) past rank 0's timeout, never all-reducing
          std::this_thread::sleep_for(4s);
          return "absent";
        }
        torch::Tensor tensor = torch::ones({1000});
        try {
          group.allreduce(tensor, c10d::ReduceOp::SUM, "lonely");
        } catch (const ddp::TimeoutError& error) {
          return std::string("timeout: ") + error.what();
        }
        return "completed";
      },
      2000ms);
  CHECK_THAT(outcome[0], Catch::StartsWith("timeout: ") && Catch::Contains("lonely") && Catch::Contains("timed out"));
  CHECK(std::chrono::steady_clock::now() - started < 20s);
}

TEST_CASE("slice size: auto slices only groups across hosts; explicit values; the environment", "[sliced]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ddp::StoreGroupOptions options;
  CHECK(ddp::new_process_group(store, 0, 1, options)->allreduce_slice_bytes() == 0);
  options.spans_hosts = true;
  auto across = ddp::new_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, options);
  CHECK(across->allreduce_slice_bytes() == ddp::kDefaultAllreduceSliceBytes);
  across->set_allreduce_slice_bytes(0);
  CHECK(across->allreduce_slice_bytes() == 0);
  across->set_allreduce_slice_bytes(4096);
  CHECK(across->allreduce_slice_bytes() == 4096);
  across->set_allreduce_slice_bytes(ddp::kAllreduceSliceAuto);
  CHECK(across->allreduce_slice_bytes() == ddp::kDefaultAllreduceSliceBytes);
  options.allreduce_slice_bytes = -2;
  CHECK_THROWS_AS(ddp::new_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, options), ddp::InvalidArgument);

  const auto from_env = [](std::map<std::string, std::string> vars) {
    return ddp::detail::allreduce_slice_bytes_from_environment(ddp::EnvironmentSnapshot::from_map(std::move(vars)).lookup());
  };
  CHECK(from_env({}) == ddp::kAllreduceSliceAuto);
  CHECK(from_env({{"DDP_ALLREDUCE_SLICE_BYTES", "auto"}}) == ddp::kAllreduceSliceAuto);
  CHECK(from_env({{"DDP_ALLREDUCE_SLICE_BYTES", "0"}}) == 0);
  CHECK(from_env({{"DDP_ALLREDUCE_SLICE_BYTES", "2097152"}}) == 2097152);
  for (const char* bad : {"-1", "1M", "x", " 5", "99999999999999999999999"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(from_env({{"DDP_ALLREDUCE_SLICE_BYTES", bad}}),
                      Catch::Contains("DDP_ALLREDUCE_SLICE_BYTES") && Catch::Contains("bytes"));
  }
}
