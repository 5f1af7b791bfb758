#pragma once
// The harness shared by ddp_bench and allreduce_bench (nccl-tests style: one harness, one small file
// per scenario): options parsed once, warm-up then timed iterations, per-phase timers, statistics,
// and the writers of the result table (CSV, JSON, Markdown). Free of LibTorch headers.
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::bench {

// Everything the command line says, parsed once (parse_options) and passed explicitly.
struct BenchOptions {
  std::string scenario = "train";                 // train | allreduce
  std::vector<std::string> models = {"lenet"};    // lenet (Fashion-MNIST shape), resnet18 (CIFAR shape)
  std::vector<std::string> modes = {"single", "dp", "ddp"};
  std::vector<int64_t> batch_sizes = {64};        // per rank in ddp, in total in single and dp
  int64_t warmup = 5;
  int64_t iters = 20;
  int threads = 0;                                // 0: $OMP_NUM_THREADS, else cores / local processes
  int64_t pool_batches = 8;                       // synthetic batches kept in memory and cycled
  std::string data = "synthetic";                 // synthetic | fashion-mnist (lenet only)
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  // the IDX files of --data fashion-mnist
  double baseline_samples_per_s = 0;              // 1-device figure for scaling efficiency (0: from the run)
  int64_t min_bytes = 4;                          // allreduce sizes: min_bytes, 2*min_bytes, ... max_bytes
  int64_t max_bytes = int64_t{256} << 20;
  std::string csv;                                // write the rows there ("" = no CSV)
  bool append = false;                            // append to --csv instead of replacing it
  std::string json;
  bool markdown = true;                           // print the Markdown table on rank 0
  // DistributedDataParallel's options in mode ddp (ddp::DdpOptions; the defaults are PyTorch's).
  double bucket_cap_mb = 25;
  bool gradient_as_bucket_view = false;
  std::string comm_hook = "allreduce";            // allreduce | fp16_compress | bf16_compress
  bool broadcast_buffers = true;
};

// Parses argv (argv[0] is the program). scenario_default fills `scenario` when --scenario is absent.
// Throws UsageError with one line on a bad flag or value.
struct UsageError {
  std::string message;
};
BenchOptions parse_options(int argc, char** argv, const std::string& scenario_default);
// Runs body(options) with the usage handling every benchmark main shares: a bad command line prints
// one line and returns 2; --help prints the flags and returns 0.
int bench_main(int argc, char** argv, const std::string& scenario_default,
               int (*body)(const BenchOptions&));

// Times the phases of one iteration: start(), then lap("phase") at the end of each phase.
class PhaseTimer {
 public:
  using Clock = std::chrono::steady_clock;
  void start() { last_ = Clock::now(); }
  // Milliseconds since start() or the previous lap(), added to `phase`.
  double lap(const std::string& phase);
  // Sum of each phase over the recorded iterations.
  const std::map<std::string, double>& totals_ms() const { return totals_; }
  void clear() { totals_.clear(); }

 private:
  Clock::time_point last_;
  std::map<std::string, double> totals_;
};

struct Summary {
  std::size_t count = 0;
  double mean = 0, median = 0, min = 0, max = 0, stddev = 0;
};
// Statistics of samples (all zero when empty).
Summary summarize(std::vector<double> samples);

// Peak resident memory of this process (VmHWM of /proc/self/status) in bytes; 0 when unknown.
int64_t peak_rss_bytes();
// Resets the peak that VmHWM reports (writes 5 to /proc/self/clear_refs); false when not allowed.
bool reset_peak_rss();

// A result table: named columns, rows of formatted cells (numbers as text).
class Table {
 public:
  explicit Table(std::vector<std::string> columns) : columns_(std::move(columns)) {}
  // Starts a row; set() its cells (unset ones stay empty).
  void add_row() { rows_.emplace_back(columns_.size()); }
  void set(const std::string& column, const std::string& value);
  void set(const std::string& column, double value, int decimals);
  const std::vector<std::string>& columns() const { return columns_; }
  const std::vector<std::vector<std::string>>& rows() const { return rows_; }

  // CSV with a header line (written only when the file is new or empty, if appending).
  void write_csv(const std::string& path, bool append) const;
  // {"meta": {...}, "rows": [{column: value}, ...]}; numeric cells as JSON numbers.
  void write_json(const std::string& path, const std::map<std::string, std::string>& meta) const;
  void write_markdown(std::ostream& out) const;

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// Writes the table where the options say (CSV, JSON, Markdown on stdout); call on rank 0 only.
void emit(const Table& table, const BenchOptions& options, const std::map<std::string, std::string>& meta,
          const std::vector<std::string>& header_lines);

// Quotes a string for JSON.
std::string json_quote(const std::string& text);
// "%.*f" of value.
std::string fixed(double value, int decimals);

}  // namespace ddp::bench
