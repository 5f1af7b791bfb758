#pragma once
// The JSON record a training run leaves for the benchmarks (--metrics-json), and peak memory.
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/base/detail/process_memory.h"

namespace ddp::examples {

struct RunMetrics {
  std::string program, model, mode, backend;
  int64_t world_size = 1;
  std::vector<std::string> devices;
  int64_t batch_size = 0;         // as passed: per process in ddp
  int64_t global_batch_size = 0;  // samples per optimizer step over all processes
  int64_t grad_accum = 1;
  int64_t train_samples = 0, test_samples = 0;
  int64_t epochs = 0;
  std::vector<double> epoch_seconds;
  std::vector<double> epoch_train_loss;
  std::vector<double> epoch_test_accuracy;
  double samples_per_second = 0;  // training samples over all processes per second of training
  double final_loss = 0, final_accuracy = 0;
  int64_t peak_memory_bytes = 0;
  std::string peak_memory_kind;  // "rss" (VmHWM) or "cuda"
};

std::string to_json(const RunMetrics& metrics);
// Writes the JSON to path atomically (write_file_atomically, ddp/base/detail/files.h). Throws ddp::IoError.
void write_metrics(const RunMetrics& metrics, const std::string& path);
// The process's peak resident set size: ddp/base/detail/process_memory.h.
using ddp::detail::peak_rss_bytes;

}  // namespace ddp::examples
