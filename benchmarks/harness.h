#pragma once
// The one harness of the benchmarks (nccl-tests style: one harness, one small file per benchmark or
// scenario): the command line (each benchmark's flags plus the shared --warmup, --iters and writer
// flags), parsed once; warm-up then timed iterations; per-phase timers; statistics; and the writers
// of the result table (CSV, JSON, Markdown). Free of LibTorch: launch_startup_bench, which links
// only the launcher's core, uses it too.
#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ddp/base/error.h"  // ddp::UsageError, the project's one usage-error type

namespace ddp::bench {

// Where the result table goes: the flags every benchmark shares.
struct OutputOptions {
  std::string csv;      // write the rows there ("" = no CSV)
  bool append = false;  // append to csv instead of replacing it
  std::string json;     // write {"meta", "rows"} there ("" = no JSON)
  bool markdown = true; // print the Markdown table on stdout (rank 0)
};

// Untimed warm-up iterations, then timed ones.
struct TimingOptions {
  int64_t warmup = 5;
  int64_t iters = 20;
};

// --help was given: the flags have been printed, the program exits 0.
struct HelpShown {};

// Note [One command line per benchmark]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every benchmark declares its own flags on a CommandLine and the harness adds the shared ones
// (add_harness_flags: --warmup, the timed-iteration flag, --csv, --append, --json, --no-markdown),
// so all of them spell and check the shared flags alike. Values are read once after parse() into
// the benchmark's options struct; a bad flag or value throws ddp::UsageError with one line that
// names it, and with_usage() turns that into one line on stderr and exit code kUsageExitCode.
class CommandLine {
 public:
  CommandLine(const std::string& program, const std::string& description);
  ~CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // A flag taking a value; `default_value` is its text when absent.
  void add(const std::string& name, const std::string& help, const std::string& default_value);
  // A flag without a value (given() says whether it was there).
  void add_switch(const std::string& name, const std::string& help);
  // The shared flags: --warmup, the timed-iteration flag (iters_flag: "iters", or "reps" where the
  // benchmark has always called it so) and the table writers' flags.
  void add_harness_flags(const TimingOptions& defaults, const std::string& iters_flag = "iters");

  // Parses argv (argv[0] is the program). Throws UsageError on an unknown flag, a missing value or
  // a stray argument; HelpShown after printing the flags for --help.
  void parse(int argc, char** argv);

  std::string text(const std::string& name) const;
  bool given(const std::string& name) const;
  // An integer in [minimum, maximum]; UsageError naming the flag otherwise.
  int64_t integer(const std::string& name, int64_t minimum, int64_t maximum = INT64_MAX) const;
  // A finite number in [minimum, maximum].
  double number(const std::string& name, double minimum, double maximum) const;
  // A comma-separated list whose every item is one of `allowed` (at least one item).
  std::vector<std::string> choices(const std::string& name, const std::set<std::string>& allowed) const;
  // Exactly one item of `allowed`.
  std::string choice(const std::string& name, const std::set<std::string>& allowed) const;
  // A comma-separated list of integers >= minimum (at least one).
  std::vector<int64_t> integers(const std::string& name, int64_t minimum) const;

  TimingOptions timing() const;  // after add_harness_flags
  OutputOptions output() const;  // after add_harness_flags

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string iters_flag_ = "iters";
};

// Runs body() with the usage handling every benchmark main shares: a ddp::UsageError prints
// "<program>: <message> (see --help)" and returns kUsageExitCode; HelpShown returns 0. Anything else
// propagates (to ddp::run_main, which writes the launcher's error file).
int with_usage(const char* program, const std::function<int()>& body);

// Everything the command line of ddp_bench and allreduce_bench says, parsed once (parse_options)
// and passed explicitly.
struct BenchOptions : OutputOptions {
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
  // DistributedDataParallel's options in mode ddp (ddp::DdpOptions; the defaults are PyTorch's).
  double bucket_cap_mb = 25;
  bool gradient_as_bucket_view = false;
  std::string comm_hook = "allreduce";            // allreduce | fp16_compress | bf16_compress
  // --comm-hook also takes fp16, bf16 and powersgd (registered on the module: ddp/algorithms/comm.h).
  int64_t powersgd_rank = 1;
  int64_t powersgd_start_iter = 2;                // compress from this iteration (warm-up included)
  bool broadcast_buffers = true;
  // The collective algorithm over CPU tensors (ddp::parse_collective_algorithm): flat | hierarchical |
  // auto; allreduce takes a comma list and measures each size with each, side by side.
  std::vector<std::string> algorithms = {"auto"};
  // The all-reduce slice size (ddp::ProcessGroup::set_allreduce_slice_bytes; 0: unsliced; -1
  // (auto): 1 MiB across hosts, else unsliced; empty: the group's own, from DDP_ALLREDUCE_SLICE_BYTES
  // or auto); allreduce takes a comma list.
  static constexpr int64_t kGroupsSliceBytes = -2;
  std::vector<int64_t> slice_bytes = {kGroupsSliceBytes};
  // Issue 15: mixed precision, DataParallel's CPU replicas, the optimizer and ZeRO (train scenario).
  std::string amp = "off";                        // off | bf16 | fp16 (autocast; fp16 with a GradScaler)
  int64_t dp_replicas = 0;                        // dp over N CPU replicas (0: DataParallel's default)
  std::string optimizer = "sgd";                  // sgd | adam
  bool zero = false;                              // ddp: ZeroRedundancyOptimizer around the optimizer
  // Issue 38, train scenario, ddp: DiLoCo over the optimizer (ddp/algorithms/diloco.h; 0: off).
  // --comm-hook none sends nothing at all: the hosts' compute ceiling, measured in the same run.
  int64_t diloco = 0;                             // H
  int64_t diloco_fragments = 1;                   // F
  int64_t diloco_delay = 0;                       // tau
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  std::string outer_dtype = "fp32";               // fp32 | bf16 | fp16 | int8
};

// Parses argv (argv[0] is the program). scenario_default fills `scenario` when --scenario is absent.
// Throws ddp::UsageError with one line on a bad flag or value, HelpShown after --help.
BenchOptions parse_options(int argc, char** argv, const std::string& scenario_default);
// with_usage around parse_options and body(options).
int bench_main(int argc, char** argv, const std::string& scenario_default,
               int (*body)(const BenchOptions&));

// Runs step() `warmup` times untimed, then `iters` times timed; returns the seconds of each timed one.
std::vector<double> time_iterations(const TimingOptions& timing, const std::function<void()>& step);
// Runs step() `warmup` times, then times `iters` back-to-back runs as one interval (nccl-tests' way:
// no clock reads between iterations, for steps of nanoseconds); returns the mean seconds of one.
double time_loop(const TimingOptions& timing, const std::function<void()>& step);

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

// Writes the table where the options say (CSV, JSON, Markdown on stdout after "# " header lines);
// call on rank 0 only.
void emit(const Table& table, const OutputOptions& output, const std::map<std::string, std::string>& meta,
          const std::vector<std::string>& header_lines);

// "%.*f" of value.
std::string fixed(double value, int decimals);

}  // namespace ddp::bench
