#include "benchmarks/harness.h"

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <sys/stat.h>

#include "ddp/base/detail/files.h"
#include "ddp/base/str.h"

namespace ddp::bench {
namespace {

constexpr mode_t kResultMode = 0644;                     // result files are for everyone to read
constexpr std::size_t kMaxAppendedFile = std::size_t{1} << 30;  // a CSV appended to: 1 GiB at most

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

bool parse_integer(const std::string& text, int64_t& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text.c_str(), &end, 10);
  if (end != text.c_str() + text.size() || errno == ERANGE) return false;
  value = parsed;
  return true;
}

bool is_number(const std::string& cell) {
  if (cell.empty()) return false;
  char* end = nullptr;
  const double value = std::strtod(cell.c_str(), &end);
  return end == cell.c_str() + cell.size() && std::isfinite(value);
}

std::string csv_cell(const std::string& cell) {
  if (cell.find_first_of(",\"\n") == std::string::npos) return cell;
  std::string quoted = "\"";
  for (char c : cell) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

}  // namespace

// --- the command line ------------------------------------------------------------------------------

struct CommandLine::Impl {
  explicit Impl(const std::string& program, const std::string& description) : cli(program, description) {}
  cxxopts::Options cli;
  cxxopts::ParseResult result;
  bool parsed = false;
};

CommandLine::CommandLine(const std::string& program, const std::string& description)
    : impl_(std::make_unique<Impl>(program, description)) {
  impl_->cli.add_options()("h,help", "this help");
}

CommandLine::~CommandLine() = default;

void CommandLine::add(const std::string& name, const std::string& help, const std::string& default_value) {
  impl_->cli.add_options()(name, help, cxxopts::value<std::string>()->default_value(default_value));
}

void CommandLine::add_switch(const std::string& name, const std::string& help) {
  impl_->cli.add_options()(name, help);
}

void CommandLine::add_harness_flags(const TimingOptions& defaults, const std::string& iters_flag) {
  iters_flag_ = iters_flag;
  add("warmup", "untimed iterations first", std::to_string(defaults.warmup));
  add(iters_flag, "timed iterations", std::to_string(defaults.iters));
  add("csv", "write the rows as CSV to this file", "");
  add_switch("append", "append to --csv (header only when the file is new)");
  add("json", "write the rows as JSON to this file", "");
  add_switch("no-markdown", "do not print the Markdown table");
}

void CommandLine::parse(int argc, char** argv) {
  try {
    impl_->result = impl_->cli.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& error) {
    throw UsageError(error.what());
  }
  if (!impl_->result.unmatched().empty()) {
    throw UsageError("unexpected argument '" + impl_->result.unmatched().front() + "'");
  }
  if (impl_->result.count("help")) {
    std::cout << impl_->cli.help() << std::endl;
    throw HelpShown{};
  }
  impl_->parsed = true;
}

std::string CommandLine::text(const std::string& name) const {
  if (!impl_->parsed) throw std::logic_error("CommandLine::text before parse");  // a bug in a benchmark
  try {
    return impl_->result[name].as<std::string>();
  } catch (const cxxopts::exceptions::exception& error) {
    throw std::logic_error("CommandLine: no flag --" + name + " declared: " + error.what());
  }
}

bool CommandLine::given(const std::string& name) const { return impl_->parsed && impl_->result.count(name) > 0; }

int64_t CommandLine::integer(const std::string& name, int64_t minimum, int64_t maximum) const {
  const std::string value = text(name);
  int64_t parsed = 0;
  if (!parse_integer(value, parsed)) throw UsageError("--" + name + ": '" + value + "' is not an integer");
  if (parsed < minimum) throw UsageError(str("--", name, " must be >= ", minimum, ", got ", parsed));
  if (parsed > maximum) throw UsageError(str("--", name, " must be <= ", maximum, ", got ", parsed));
  return parsed;
}

double CommandLine::number(const std::string& name, double minimum, double maximum) const {
  const std::string value = text(name);
  if (!is_number(value)) throw UsageError("--" + name + ": '" + value + "' is not a number");
  const double parsed = std::strtod(value.c_str(), nullptr);
  if (!(parsed >= minimum && parsed <= maximum)) {
    throw UsageError(str("--", name, " must be in [", minimum, ", ", maximum, "], got ", value));
  }
  return parsed;
}

std::vector<std::string> CommandLine::choices(const std::string& name, const std::set<std::string>& allowed) const {
  std::vector<std::string> items = split_list(text(name));
  if (items.empty()) throw UsageError("--" + name + " needs at least one value");
  for (const auto& item : items) {
    if (allowed.count(item) == 0) {
      throw UsageError("--" + name + ": unknown value '" + item + "' (choose from " + join(allowed, ", ") + ")");
    }
  }
  return items;
}

std::string CommandLine::choice(const std::string& name, const std::set<std::string>& allowed) const {
  const auto items = choices(name, allowed);
  if (items.size() != 1) throw UsageError(str("--", name, " takes one value, got ", items.size()));
  return items.front();
}

std::vector<int64_t> CommandLine::integers(const std::string& name, int64_t minimum) const {
  std::vector<int64_t> values;
  for (const auto& item : split_list(text(name))) {
    int64_t value = 0;
    if (!parse_integer(item, value) || value < minimum) {
      throw UsageError(str("--", name, ": '", item, "' is not an integer >= ", minimum));
    }
    values.push_back(value);
  }
  if (values.empty()) throw UsageError("--" + name + " needs at least one value");
  return values;
}

TimingOptions CommandLine::timing() const {
  TimingOptions timing;
  timing.warmup = integer("warmup", 0);
  timing.iters = integer(iters_flag_, 1);
  return timing;
}

OutputOptions CommandLine::output() const {
  OutputOptions output;
  output.csv = text("csv");
  output.append = given("append");
  output.json = text("json");
  output.markdown = !given("no-markdown");
  return output;
}

int with_usage(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const HelpShown&) {
    return 0;
  } catch (const UsageError& error) {
    std::cerr << program << ": " << error.what() << " (see --help)" << std::endl;
    return kUsageExitCode;
  }
}

// --- ddp_bench and allreduce_bench ------------------------------------------------------------------

BenchOptions parse_options(int argc, char** argv, const std::string& scenario_default) {
  CommandLine cli(argc > 0 ? argv[0] : "ddp_bench",
                  "Training and all-reduce benchmarks (warm-up, then timed iterations). Under ddp_launch for "
                  "world sizes > 1; only rank 0 prints. See docs/benchmarks.md.");
  const BenchOptions d;
  cli.add("scenario", "train | allreduce", scenario_default);
  cli.add("model", "comma list: lenet (Fashion-MNIST shape), resnet18 (CIFAR shape)", "lenet");
  cli.add("mode", "comma list: single, dp, ddp (single and dp only without a launcher)", "single,dp,ddp");
  cli.add("batch", "comma list of batch sizes (per rank in ddp, in total in single and dp)", "64");
  cli.add_harness_flags(TimingOptions{d.warmup, d.iters});
  cli.add("threads", "intra-op threads per process (0: $OMP_NUM_THREADS, else cores / local processes)", "0");
  cli.add("data", "synthetic | fashion-mnist (the examples' pipeline: ImageDataset + DistributedSampler + data "
          "loader; lenet only)", d.data);
  cli.add("data-dir", "folder of the Fashion-MNIST IDX files (Debian's dataset-fashion-mnist)", d.data_dir);
  cli.add("pool-batches", "synthetic batches kept in memory and cycled", std::to_string(d.pool_batches));
  cli.add("baseline", "samples/s of one device, for the scaling efficiency column (0: from the single rows of "
          "this run)", "0");
  cli.add("min-bytes", "allreduce: smallest message (a multiple of 4)", std::to_string(d.min_bytes));
  cli.add("max-bytes", "allreduce: largest message (sizes double up to it)", std::to_string(d.max_bytes));
  cli.add("bucket-cap-mb", "ddp: gradient bucket size in MiB", "25");
  cli.add_switch("gradient-as-bucket-view", "ddp: gradients are views into the buckets (no copies in and out)");
  cli.add("comm-hook", "ddp: allreduce | fp16 | bf16 | powersgd | none (no communication: the compute ceiling)",
          "allreduce");
  cli.add("powersgd-rank", "ddp with --comm-hook powersgd: the approximation's rank", "1");
  cli.add("powersgd-start-iter", "ddp with --comm-hook powersgd: iterations all-reduced before compressing (>= 2)", "2");
  cli.add_switch("no-broadcast-buffers", "ddp: do not broadcast buffers (BatchNorm statistics) at each forward");
  cli.add("algorithm", "collectives over CPU tensors: flat | hierarchical | auto (allreduce: a comma list, "
          "measured side by side)", "auto");
  cli.add("slice-bytes", "CPU all-reduces over Gloo in slices of about this many bytes, several in flight (0: "
          "unsliced; auto: 1 MiB across hosts, else unsliced; allreduce: a comma list, measured side by side; empty: "
          "DDP_ALLREDUCE_SLICE_BYTES, else auto)", "");
  cli.add("amp", "train: mixed precision off | bf16 | fp16 (autocast; fp16 scales the loss with a GradScaler)", "off");
  cli.add("dp-replicas", "train, dp: N replicas on the CPU, each on its own thread (0: every CUDA device, else one)", "0");
  cli.add("optimizer", "train: sgd | adam", "sgd");
  cli.add_switch("zero", "train, ddp: shard the optimizer state over the ranks (ZeroRedundancyOptimizer)");
  cli.add("diloco", "train, ddp: DiLoCo, H local steps between outer steps (0: off)", "0");
  cli.add("diloco-fragments", "train, ddp, with --diloco: streaming DiLoCo's fragments F", "1");
  cli.add("diloco-delay", "train, ddp, with --diloco: inner steps each exchange overlaps (< H / F)", "0");
  cli.add("outer-lr", "with --diloco: the outer SGD's learning rate", "0.7");
  cli.add("outer-momentum", "with --diloco: the outer SGD's Nesterov momentum", "0.9");
  cli.add("outer-dtype", "with --diloco: fp32 | bf16 | fp16 | int8", "fp32");
  cli.parse(argc, argv);

  BenchOptions options;
  static_cast<OutputOptions&>(options) = cli.output();
  options.scenario = cli.choices("scenario", {"train", "allreduce"}).front();
  options.models = cli.choices("model", {"lenet", "resnet18"});
  options.modes = cli.choices("mode", {"single", "dp", "ddp"});
  options.batch_sizes = cli.integers("batch", 1);
  const TimingOptions timing = cli.timing();
  options.warmup = timing.warmup;
  options.iters = timing.iters;
  options.threads = static_cast<int>(cli.integer("threads", 0, 4096));
  options.pool_batches = cli.integer("pool-batches", 1);
  options.data = cli.choices("data", {"synthetic", "fashion-mnist"}).front();
  options.data_dir = cli.text("data-dir");
  if (options.data == "fashion-mnist" && options.scenario == "train") {
    for (const auto& model : options.models) {
      if (model != "lenet") throw UsageError("--data fashion-mnist trains lenet only (1x28x28 images), not " + model);
    }
  }
  const std::string baseline = cli.text("baseline");
  options.baseline_samples_per_s = is_number(baseline) ? std::strtod(baseline.c_str(), nullptr) : -1;
  if (!(options.baseline_samples_per_s >= 0)) throw UsageError("--baseline must be a number >= 0, got '" + baseline + "'");
  options.min_bytes = cli.integer("min-bytes", 4);
  options.max_bytes = cli.integer("max-bytes", options.min_bytes);
  if (options.min_bytes % 4 != 0) throw UsageError("--min-bytes must be a multiple of 4 (float32 elements)");
  const std::string cap = cli.text("bucket-cap-mb");
  options.bucket_cap_mb = is_number(cap) ? std::strtod(cap.c_str(), nullptr) : 0;
  if (!(options.bucket_cap_mb > 0 && options.bucket_cap_mb <= 4096)) throw UsageError("--bucket-cap-mb must be in (0, 4096]");
  options.gradient_as_bucket_view = cli.given("gradient-as-bucket-view");
  options.comm_hook = cli.choice("comm-hook", {"allreduce", "fp16_compress", "bf16_compress", "fp16", "bf16", "powersgd", "none"});
  options.powersgd_rank = cli.integer("powersgd-rank", 1);
  options.powersgd_start_iter = cli.integer("powersgd-start-iter", 2);
  options.broadcast_buffers = !cli.given("no-broadcast-buffers");
  options.algorithms = cli.choices("algorithm", {"flat", "hierarchical", "auto"});
  if (options.scenario == "train" && options.algorithms.size() != 1) {
    throw UsageError("--algorithm takes one value for the train scenario (a comma list only with allreduce)");
  }
  if (const std::string slices = cli.text("slice-bytes"); !slices.empty()) {
    options.slice_bytes.clear();
    for (const std::string& item : split_list(slices)) {
      int64_t bytes = -1;  // auto: ddp::kAllreduceSliceAuto (this file is torch-free)
      if (item != "auto" && (!parse_integer(item, bytes) || bytes < 0)) {
        throw UsageError("--slice-bytes takes a comma list of byte counts >= 0 or auto, got '" + slices + "'");
      }
      options.slice_bytes.push_back(bytes);
    }
  }
  if (options.scenario == "train" && options.slice_bytes.size() != 1) {
    throw UsageError("--slice-bytes takes one value for the train scenario (a comma list only with allreduce)");
  }
  options.amp = cli.choice("amp", {"off", "bf16", "fp16"});
  options.dp_replicas = cli.integer("dp-replicas", 0, 1024);
  options.optimizer = cli.choice("optimizer", {"sgd", "adam"});
  options.zero = cli.given("zero");
  options.diloco = cli.integer("diloco", 0);
  options.diloco_fragments = cli.integer("diloco-fragments", 1);
  options.diloco_delay = cli.integer("diloco-delay", 0);
  options.outer_lr = cli.number("outer-lr", 1e-6, 1e6);
  options.outer_momentum = cli.number("outer-momentum", 0, 0.999999);
  options.outer_dtype = cli.choice("outer-dtype", {"fp32", "bf16", "fp16", "int8"});
  if (options.diloco > 0 && (options.comm_hook != "allreduce" || options.zero || options.amp == "fp16")) {
    throw UsageError("--diloco sends no gradients: drop --comm-hook, --zero and --amp fp16");
  }
  if (options.diloco > 0 && options.diloco_delay >= std::max<int64_t>(1, options.diloco / options.diloco_fragments)) {
    throw UsageError("--diloco-delay must be less than --diloco / --diloco-fragments");
  }
  return options;
}

int bench_main(int argc, char** argv, const std::string& scenario_default, int (*body)(const BenchOptions&)) {
  return with_usage(argc > 0 ? argv[0] : "bench", [&] { return body(parse_options(argc, argv, scenario_default)); });
}

// --- timing and statistics ---------------------------------------------------------------------------

std::vector<double> time_iterations(const TimingOptions& timing, const std::function<void()>& step) {
  for (int64_t i = 0; i < timing.warmup; ++i) step();
  std::vector<double> seconds;
  seconds.reserve(static_cast<std::size_t>(timing.iters));
  for (int64_t i = 0; i < timing.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

double time_loop(const TimingOptions& timing, const std::function<void()>& step) {
  for (int64_t i = 0; i < timing.warmup; ++i) step();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < timing.iters; ++i) step();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return timing.iters > 0 ? seconds / static_cast<double>(timing.iters) : 0.0;
}

double PhaseTimer::lap(const std::string& phase) {
  const auto now = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
  totals_[phase] += ms;
  last_ = now;
  return ms;
}

Summary summarize(std::vector<double> samples) {
  Summary s;
  s.count = samples.size();
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  s.min = samples.front();
  s.max = samples.back();
  s.median = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(n);
  double squares = 0;
  for (double x : samples) squares += (x - s.mean) * (x - s.mean);
  s.stddev = n > 1 ? std::sqrt(squares / static_cast<double>(n - 1)) : 0.0;
  return s;
}

// --- the table writers -------------------------------------------------------------------------------

void Table::set(const std::string& column, const std::string& value) {
  const auto it = std::find(columns_.begin(), columns_.end(), column);
  if (it == columns_.end() || rows_.empty()) {
    throw std::logic_error("Table::set: no column '" + column + "' or no row");  // a bug in a scenario
  }
  rows_.back()[static_cast<std::size_t>(it - columns_.begin())] = value;
}

void Table::set(const std::string& column, double value, int decimals) { set(column, fixed(value, decimals)); }

void Table::write_csv(const std::string& path, bool append) const {
  // Appending rewrites the file through a temporary and a rename (ddp/base/detail/files.h): a reader never
  // sees half a row, and a planted symlink is replaced, not written through.
  std::string text;
  struct stat info {};
  if (append && ::lstat(path.c_str(), &info) == 0) text = detail::read_file(path, kMaxAppendedFile);
  const auto line = [&](const std::vector<std::string>& cells) {
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if (i > 0) text += ',';
      text += csv_cell(cells[i]);  // appended, not "," + cell: gcc 12's -Wrestrict misfires on that in C++20
    }
    text += '\n';
  };
  if (text.empty()) line(columns_);
  for (const auto& row : rows_) line(row);
  detail::write_file_atomically(path, text, kResultMode);
}

void Table::write_json(const std::string& path, const std::map<std::string, std::string>& meta) const {
  nlohmann::ordered_json document;
  document["meta"] = nlohmann::ordered_json::object();
  for (const auto& [key, value] : meta) document["meta"][key] = value;
  document["rows"] = nlohmann::ordered_json::array();
  for (const auto& row : rows_) {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      const std::string& cell = row[c];
      // Numeric cells as JSON numbers (integers stay integers); "1." and the like, not JSON, as text.
      auto value = is_number(cell) ? nlohmann::ordered_json::parse(cell, nullptr, false) : nlohmann::ordered_json(cell);
      object[columns_[c]] = value.is_discarded() ? nlohmann::ordered_json(cell) : std::move(value);
    }
    document["rows"].push_back(std::move(object));
  }
  detail::write_file_atomically(path, document.dump(2) + "\n", kResultMode);
}

void Table::write_markdown(std::ostream& out) const {
  out << '|';
  for (const auto& column : columns_) out << ' ' << column << " |";
  out << "\n|";
  for (std::size_t i = 0; i < columns_.size(); ++i) out << "---|";
  out << '\n';
  for (const auto& row : rows_) {
    out << '|';
    for (const auto& cell : row) out << ' ' << cell << " |";
    out << '\n';
  }
  out.flush();
}

void emit(const Table& table, const OutputOptions& output, const std::map<std::string, std::string>& meta,
          const std::vector<std::string>& header_lines) {
  if (output.markdown) {
    for (const auto& line : header_lines) std::cout << "# " << line << '\n';
    table.write_markdown(std::cout);
  }
  if (!output.csv.empty()) table.write_csv(output.csv, output.append);
  if (!output.json.empty()) table.write_json(output.json, meta);
}

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

}  // namespace ddp::bench
