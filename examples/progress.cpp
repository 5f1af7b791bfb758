#include "examples/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace ddp::examples {
namespace {

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long>(seconds + 0.5);
  char buffer[32];
  if (s >= 3600) {
    std::snprintf(buffer, sizeof buffer, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buffer, sizeof buffer, "%02ld:%02ld", s / 60, s % 60);
  }
  return buffer;
}

}  // namespace

bool is_terminal(int fd) { return isatty(fd) == 1; }

ProgressLine::ProgressLine(std::ostream& out, bool terminal, std::string label, int64_t total_steps,
                           int64_t samples_per_step, std::chrono::milliseconds log_interval)
    : out_(out),
      terminal_(terminal),
      label_(std::move(label)),
      total_(total_steps),
      samples_per_step_(samples_per_step),
      interval_(terminal ? std::chrono::milliseconds(100) : log_interval),
      start_(Clock::now()),
      last_print_(start_) {}

std::string ProgressLine::format(const std::string& label, int64_t step, int64_t total, double seconds,
                                 int64_t samples_per_step, double loss) {
  const double rate = seconds > 0 ? step / seconds : 0.0;
  const double eta = rate > 0 ? (total - step) / rate : NAN;
  constexpr int kWidth = 20;
  const int filled = total > 0 ? static_cast<int>(kWidth * step / total) : 0;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, "%s %3d%% [%s] %lld/%lld [%s<%s, %.2f it/s, %.0f samples/s, loss %.4f]",
                label.c_str(), total > 0 ? static_cast<int>(100 * step / total) : 0, bar.c_str(),
                static_cast<long long>(step), static_cast<long long>(total), clock_text(seconds).c_str(),
                clock_text(eta).c_str(), rate, rate * static_cast<double>(samples_per_step), loss);
  return buffer;
}

void ProgressLine::update(int64_t step, double loss) {
  step_ = step;
  loss_ = loss;
  const auto now = Clock::now();
  if (now - last_print_ >= interval_) {
    last_print_ = now;
    print(false);
  }
}

void ProgressLine::finish() {
  if (finished_) return;
  finished_ = true;
  print(true);
}

void ProgressLine::print(bool final) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  const std::string line = format(label_, step_, total_, seconds, samples_per_step_, loss_);
  if (terminal_) {
    out_ << '\r' << line << "\033[K";
    if (final) out_ << '\n';
  } else {
    out_ << line << '\n';
  }
  out_.flush();
}

}  // namespace ddp::examples
