#pragma once
// A tqdm-like progress line for rank 0: steps, it/s, samples/s, loss, ETA.
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace ddp::examples {

// Note [Progress on a terminal and in a log]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On a terminal the line is redrawn in place (carriage return) at most ten times a second. When the
// output is a file or a pipe (CI, ddp_launch's log redirection) carriage returns would pile up into one
// giant line, so a full line is printed instead every `log_interval` (and at the end).
class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;

  ProgressLine(std::ostream& out, bool terminal, std::string label, int64_t total_steps, int64_t samples_per_step,
               std::chrono::milliseconds log_interval = std::chrono::seconds(10));

  // After step `step` (1-based) with the given loss (running mean, say).
  void update(int64_t step, double loss);
  // Ends the line (terminal) or prints the final full line (log).
  void finish();

  // The text of the line for a given state: pure, for the tests.
  static std::string format(const std::string& label, int64_t step, int64_t total, double seconds,
                            int64_t samples_per_step, double loss);

 private:
  void print(bool final);

  std::ostream& out_;
  bool terminal_;
  std::string label_;
  int64_t total_, samples_per_step_;
  std::chrono::milliseconds interval_;
  Clock::time_point start_, last_print_;
  int64_t step_ = 0;
  double loss_ = 0;
  bool finished_ = false;
};

// True when the file descriptor is a terminal.
bool is_terminal(int fd);

}  // namespace ddp::examples
