// The real ddp_launch with --nnodes MIN:MAX, without other hosts (See Note [Elastic rounds]): the
// dry run shows the range; bad elastic input is one line, exit 2. The rounds themselves run on
// namespace hosts (tests/hosts/elastic_test.sh).
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/launcher/process_harness.h"

using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

TEST_CASE("--nnodes MIN:MAX: the dry run shows the range of nodes and world sizes", "[process][dry_run]") {
  const auto outcome =
      run_launcher({"--nnodes", "2:3", "--nproc_per_node", "2", "--rdzv_endpoint", "127.0.0.1:29999", "--dry_run",
                    "/bin/true"},
                   {}, 10s);
  CHECK(outcome.exit_code == 0);
  CHECK_THAT(outcome.out, Catch::Contains("2 workers on node <assigned at rendezvous> of 2 to 3 (elastic), world "
                                          "size 4 to 6"));
}

TEST_CASE("--nnodes MIN:MAX without the c10d rendezvous is one line, exit 2", "[process][bad_input]") {
  const auto outcome = run_launcher({"--nnodes", "2:3", "--master_addr", "127.0.0.1", "/bin/true"}, {}, 10s);
  CHECK(outcome.exit_code == 2);
  CHECK(outcome.err == "ddp_launch: error: --nnodes 2:3 (elastic membership) needs the c10d rendezvous: add "
                       "--rdzv_endpoint HOST:PORT (and the same --rdzv_id on every node); the static rendezvous "
                       "(--node_rank, --master_addr) has a fixed node count\n");
}
