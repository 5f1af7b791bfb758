#include "examples/metrics.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ddp/base/error.h"

namespace ddp::examples {
namespace {

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out += buffer;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string number(double value) {
  if (!std::isfinite(value)) return "null";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6g", value);
  return buffer;
}

template <typename T, typename F>
std::string array(const std::vector<T>& values, F item) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + item(values[i]);
  return out + "]";
}

}  // namespace

std::string to_json(const RunMetrics& m) {
  std::ostringstream j;
  j << "{\n"
    << "  \"program\": " << quoted(m.program) << ",\n"
    << "  \"model\": " << quoted(m.model) << ",\n"
    << "  \"mode\": " << quoted(m.mode) << ",\n"
    << "  \"backend\": " << quoted(m.backend) << ",\n"
    << "  \"world_size\": " << m.world_size << ",\n"
    << "  \"devices\": " << array(m.devices, quoted) << ",\n"
    << "  \"batch_size\": " << m.batch_size << ",\n"
    << "  \"global_batch_size\": " << m.global_batch_size << ",\n"
    << "  \"grad_accum\": " << m.grad_accum << ",\n"
    << "  \"train_samples\": " << m.train_samples << ",\n"
    << "  \"test_samples\": " << m.test_samples << ",\n"
    << "  \"epochs\": " << m.epochs << ",\n"
    << "  \"epoch_seconds\": " << array(m.epoch_seconds, number) << ",\n"
    << "  \"epoch_train_loss\": " << array(m.epoch_train_loss, number) << ",\n"
    << "  \"epoch_test_accuracy\": " << array(m.epoch_test_accuracy, number) << ",\n"
    << "  \"samples_per_second\": " << number(m.samples_per_second) << ",\n"
    << "  \"final_loss\": " << number(m.final_loss) << ",\n"
    << "  \"final_accuracy\": " << number(m.final_accuracy) << ",\n"
    << "  \"peak_memory_bytes\": " << m.peak_memory_bytes << ",\n"
    << "  \"peak_memory_kind\": " << quoted(m.peak_memory_kind) << "\n"
    << "}\n";
  return j.str();
}

void write_metrics(const RunMetrics& metrics, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << to_json(metrics);
    out.close();
    if (!out) throw IoError(str(tmp, ": cannot write the metrics (is the folder there and writable?)"));
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  if (error) throw IoError(str(path, ": cannot write the metrics: ", error.message()));
}

}  // namespace ddp::examples
