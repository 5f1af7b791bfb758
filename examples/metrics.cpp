#include "examples/metrics.h"

#include <fstream>
#include <sstream>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "ddp/base/detail/json_text.h"

namespace ddp::examples {
namespace {

// "[a, b, c]" (the record keeps its arrays on one line; see Note [JSON through nlohmann-json] in
// ddp/base/detail/json_text.h).
template <typename T, typename F>
std::string array(const std::vector<T>& values, F item) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + item(values[i]);
  return out + "]";
}

std::string text(const std::string& value) { return detail::json_string(value); }

}  // namespace

std::string to_json(const RunMetrics& m) {
  std::ostringstream j;
  j << "{\n"
    << "  \"program\": " << text(m.program) << ",\n"
    << "  \"model\": " << text(m.model) << ",\n"
    << "  \"mode\": " << text(m.mode) << ",\n"
    << "  \"backend\": " << text(m.backend) << ",\n"
    << "  \"world_size\": " << m.world_size << ",\n"
    << "  \"devices\": " << array(m.devices, text) << ",\n"
    << "  \"batch_size\": " << m.batch_size << ",\n"
    << "  \"global_batch_size\": " << m.global_batch_size << ",\n"
    << "  \"grad_accum\": " << m.grad_accum << ",\n"
    << "  \"train_samples\": " << m.train_samples << ",\n"
    << "  \"test_samples\": " << m.test_samples << ",\n"
    << "  \"epochs\": " << m.epochs << ",\n"
    << "  \"epoch_seconds\": " << array(m.epoch_seconds, detail::json_number) << ",\n"
    << "  \"epoch_train_loss\": " << array(m.epoch_train_loss, detail::json_number) << ",\n"
    << "  \"epoch_test_accuracy\": " << array(m.epoch_test_accuracy, detail::json_number) << ",\n"
    << "  \"samples_per_second\": " << detail::json_number(m.samples_per_second) << ",\n"
    << "  \"final_loss\": " << detail::json_number(m.final_loss) << ",\n"
    << "  \"final_accuracy\": " << detail::json_number(m.final_accuracy) << ",\n"
    << "  \"peak_memory_bytes\": " << m.peak_memory_bytes << ",\n"
    << "  \"peak_memory_kind\": " << text(m.peak_memory_kind) << "\n"
    << "}\n";
  return j.str();
}

void write_metrics(const RunMetrics& metrics, const std::string& path) {
  try {
    detail::write_file_atomically(path, to_json(metrics), 0644);
  } catch (const IoError& error) {
    throw IoError(str("cannot write the metrics (is the folder there and writable?): ", error.what()));
  }
}

}  // namespace ddp::examples
