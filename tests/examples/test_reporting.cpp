// The progress line and the metrics record.
#include <catch2/catch.hpp>

#include <algorithm>
#include <sstream>

#include "examples/metrics.h"
#include "examples/progress.h"

using namespace ddp::examples;
using Catch::Matchers::Contains;

TEST_CASE("the progress line shows steps, rates, loss and ETA", "[reporting]") {
  CHECK(ProgressLine::format("epoch 1/5", 50, 100, 10.0, 64, 0.5) ==
        "epoch 1/5  50% [##########..........] 50/100 [00:10<00:10, 5.00 it/s, 320 samples/s, loss 0.5000]");
  CHECK(ProgressLine::format("e", 0, 10, 0.0, 8, 2.0) ==
        "e   0% [....................] 0/10 [00:00<?, 0.00 it/s, 0 samples/s, loss 2.0000]");
  CHECK_THAT(ProgressLine::format("e", 3, 3, 4000.0, 1, 0.1), Contains("[1:06:40<00:00"));
}

TEST_CASE("the progress line redraws in place on a terminal and prints full lines in a log", "[reporting]") {
  std::ostringstream log, terminal;
  ProgressLine in_log(log, false, "e", 4, 2, std::chrono::milliseconds(0));
  ProgressLine on_terminal(terminal, true, "e", 4, 2);
  for (int step = 1; step <= 4; ++step) {
    in_log.update(step, 1.0);
    on_terminal.update(step, 1.0);
  }
  in_log.finish();
  on_terminal.finish();
  const std::string lines = log.str(), redrawn = terminal.str();
  CHECK(lines.find('\r') == std::string::npos);
  CHECK(std::count(lines.begin(), lines.end(), '\n') == 5);  // every update (interval 0), then the end
  CHECK(redrawn.rfind('\r', 0) == 0);
  CHECK(std::count(redrawn.begin(), redrawn.end(), '\n') == 1);  // only at the end
  CHECK_THAT(redrawn, Contains("4/4"));
}

TEST_CASE("the metrics record is JSON with every field", "[reporting]") {
  RunMetrics m;
  m.program = "p\"q";
  m.mode = "ddp";
  m.world_size = 2;
  m.devices = {"cpu"};
  m.epoch_seconds = {1.5, 2.25};
  m.final_accuracy = 0.9;
  const std::string json = to_json(m);
  CHECK_THAT(json, Contains("\"program\": \"p\\\"q\"") && Contains("\"world_size\": 2") &&
                       Contains("\"devices\": [\"cpu\"]") && Contains("\"epoch_seconds\": [1.5, 2.25]") &&
                       Contains("\"final_accuracy\": 0.9") && Contains("\"peak_memory_bytes\": 0"));
  CHECK(json.front() == '{');
  CHECK(peak_rss_bytes() > 1 << 20);
}
