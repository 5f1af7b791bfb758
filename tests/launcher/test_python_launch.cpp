// A Python DDP script under ddp_launch, as under torchrun (See Note [Python workers] in
// launcher/config/worker_command.cpp): `ddp_launch --nproc_per_node 2 train.py` runs `PYTHON -u train.py`
// per rank with torchrun's environment, and the ranks train together over Gloo.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "process_harness.h"

using namespace ddp::launcher::testing;
using namespace std::chrono_literals;

TEST_CASE("a 2-rank Gloo PyTorch DDP script trains under ddp_launch", "[python]") {
  const std::string python = DDP_TEST_PYTHON;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0) {
    SUCCEED("no python with torch (DDP_PYTHON) to run the script; skipped");
    return;
  }
  const std::string script = std::string(DDP_TEST_SOURCE_DIR) + "/examples/python/ddp_gloo_train.py";
  // The interpreter from $PYTHON; no --master_port: a free one, announced in the start-up line.
  const auto outcome = run_launcher({"--nproc_per_node", "2", "--role", "trainer", script, "--steps", "3"},
                                    {{"PYTHON", python}}, 120s);
  INFO(outcome.err);
  INFO(outcome.out);
  CHECK(outcome.exit_code == 0);
  CHECK_THAT(outcome.err, Catch::Matches("(.|\n)*master 127\\.0\\.0\\.1:[0-9]+(.|\n)*"));
  for (const char* rank : {"0", "1"}) {
    CHECK_THAT(outcome.out, Catch::Contains(std::string("[rank ") + rank + "]: rank " + rank +
                                            ": 3 steps, parameters identical on every rank: True"));
  }
  CHECK_THAT(outcome.out, Catch::Contains("of 2, role trainer)"));
}
