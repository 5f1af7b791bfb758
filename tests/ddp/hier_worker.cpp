// Worker of tests/hosts/hier_test.sh: on real (namespace) hosts, under ddp_launch, the group must
// find its topology by exchanging host identities (Note [Host topology]) and its hierarchical
// all-reduce, broadcast and all-gather must equal the flat ones. Exits 0 and prints "hier ok" when
// every check holds; any difference is an error (exit 1, via run_main).
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw ddp::Error("hier_worker: " + what);
}

int run(int, char**) {
  ddp::InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(30);
  const auto group = ddp::init_process_group(init);
  const int rank = group->rank(), world = group->size();
  group->set_collective_algorithm(ddp::CollectiveAlgorithm::kHierarchical);
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    for (const std::int64_t numel : {0, 1, 1001, 300000}) {
      const auto input = [&](int r) { return torch::arange(numel, torch::kDouble).mul(0.37).add(1.3 * r).sin().to(dtype); };
      const std::string where = ddp::str(c10::toString(dtype), " x ", numel, " on rank ", rank);
      auto flat = input(rank);
      auto hierarchical = flat.clone();
      group->set_collective_algorithm(ddp::CollectiveAlgorithm::kFlat);
      group->allreduce(flat);
      group->set_collective_algorithm(ddp::CollectiveAlgorithm::kHierarchical);
      group->allreduce(hierarchical);
      check(std::string(group->recent_collectives().back().algorithm) == "hierarchical", "flat all-reduce for " + where);
      const double tolerance = dtype == torch::kBFloat16 ? 0.4 : dtype == torch::kHalf ? 0.08 : 1e-4;
      check(numel == 0 || (flat.to(torch::kDouble) - hierarchical.to(torch::kDouble)).abs().max().item<double>() <= tolerance,
            "all-reduce differs for " + where);
      auto mine = input(rank);
      group->broadcast(mine, world - 1);
      check(torch::equal(mine, input(world - 1)), "broadcast differs for " + where);
      const auto gathered = group->allgather(input(rank));
      for (int r = 0; r < world; ++r) check(torch::equal(gathered[static_cast<std::size_t>(r)], input(r)), "all-gather differs for " + where);
    }
  }
  const std::string choice = group->algorithm_choice();
  check(choice.find("hierarchical (") == 0 && choice.find("2 hosts x 2 ranks") != std::string::npos,
        "unexpected algorithm choice: " + choice);
  group->barrier();
  std::cout << "hier ok rank " << rank << ": " << choice << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ddp::run_main(argc, argv, run); }
