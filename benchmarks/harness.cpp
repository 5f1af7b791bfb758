#include "benchmarks/harness.h"

#include <cxxopts.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

namespace ddp::bench {
namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// Every item of a comma-separated flag must be one of `allowed`.
std::vector<std::string> choices(const std::string& flag, const std::string& text, const std::set<std::string>& allowed) {
  std::vector<std::string> items = split_list(text);
  if (items.empty()) throw UsageError{"--" + flag + " needs at least one value"};
  for (const auto& item : items) {
    if (allowed.count(item) == 0) {
      std::string names;
      for (const auto& name : allowed) names += (names.empty() ? "" : ", ") + name;
      throw UsageError{"--" + flag + ": unknown value '" + item + "' (choose from " + names + ")"};
    }
  }
  return items;
}

int64_t positive(const std::string& flag, int64_t value, int64_t minimum) {
  if (value < minimum) throw UsageError{"--" + flag + " must be >= " + std::to_string(minimum) + ", got " + std::to_string(value)};
  return value;
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

BenchOptions parse_options(int argc, char** argv, const std::string& scenario_default) {
  cxxopts::Options cli(argc > 0 ? argv[0] : "ddp_bench",
                       "Training and all-reduce benchmarks (warm-up, then timed iterations). Under ddp_launch for "
                       "world sizes > 1; only rank 0 prints. See docs/benchmarks.md.");
  const BenchOptions d;
  cli.add_options()
      ("scenario", "train | allreduce", cxxopts::value<std::string>()->default_value(scenario_default))
      ("model", "comma list: lenet (Fashion-MNIST shape), resnet18 (CIFAR shape)", cxxopts::value<std::string>()->default_value("lenet"))
      ("mode", "comma list: single, dp, ddp (single and dp only without a launcher)", cxxopts::value<std::string>()->default_value("single,dp,ddp"))
      ("batch", "comma list of batch sizes (per rank in ddp, in total in single and dp)", cxxopts::value<std::string>()->default_value("64"))
      ("warmup", "untimed iterations first", cxxopts::value<int64_t>()->default_value(std::to_string(d.warmup)))
      ("iters", "timed iterations", cxxopts::value<int64_t>()->default_value(std::to_string(d.iters)))
      ("threads", "intra-op threads per process (0: $OMP_NUM_THREADS, else cores / local processes)", cxxopts::value<int>()->default_value("0"))
      ("data", "synthetic | fashion-mnist (the examples' pipeline: ImageDataset + DistributedSampler + data loader; lenet only)", cxxopts::value<std::string>()->default_value(d.data))
      ("data-dir", "folder of the Fashion-MNIST IDX files (Debian's dataset-fashion-mnist)", cxxopts::value<std::string>()->default_value(d.data_dir))
      ("pool-batches", "synthetic batches kept in memory and cycled", cxxopts::value<int64_t>()->default_value(std::to_string(d.pool_batches)))
      ("baseline", "samples/s of one device, for the scaling efficiency column (0: from the single rows of this run)", cxxopts::value<double>()->default_value("0"))
      ("min-bytes", "allreduce: smallest message (a multiple of 4)", cxxopts::value<int64_t>()->default_value(std::to_string(d.min_bytes)))
      ("max-bytes", "allreduce: largest message (sizes double up to it)", cxxopts::value<int64_t>()->default_value(std::to_string(d.max_bytes)))
      ("bucket-cap-mb", "ddp: gradient bucket size in MiB", cxxopts::value<double>()->default_value("25"))
      ("gradient-as-bucket-view", "ddp: gradients are views into the buckets (no copies in and out)")
      ("comm-hook", "ddp: allreduce | fp16_compress | bf16_compress", cxxopts::value<std::string>()->default_value("allreduce"))
      ("no-broadcast-buffers", "ddp: do not broadcast buffers (BatchNorm statistics) at each forward")
      ("csv", "write the rows as CSV to this file", cxxopts::value<std::string>()->default_value(""))
      ("append", "append to --csv (header only when the file is new)")
      ("json", "write the rows as JSON to this file", cxxopts::value<std::string>()->default_value(""))
      ("no-markdown", "do not print the Markdown table")
      ("h,help", "this help");
  BenchOptions options;
  try {
    const auto result = cli.parse(argc, argv);
    if (!result.unmatched().empty()) throw UsageError{"unexpected argument '" + result.unmatched().front() + "'"};
    if (result.count("help")) {
      std::cout << cli.help() << std::endl;
      throw UsageError{""};
    }
    options.scenario = choices("scenario", result["scenario"].as<std::string>(), {"train", "allreduce"}).front();
    options.models = choices("model", result["model"].as<std::string>(), {"lenet", "resnet18"});
    options.modes = choices("mode", result["mode"].as<std::string>(), {"single", "dp", "ddp"});
    options.batch_sizes.clear();
    for (const auto& item : split_list(result["batch"].as<std::string>())) {
      char* end = nullptr;
      const long long value = std::strtoll(item.c_str(), &end, 10);
      if (end != item.c_str() + item.size() || value < 1) throw UsageError{"--batch: '" + item + "' is not a positive integer"};
      options.batch_sizes.push_back(value);
    }
    if (options.batch_sizes.empty()) throw UsageError{"--batch needs at least one value"};
    options.warmup = positive("warmup", result["warmup"].as<int64_t>(), 0);
    options.iters = positive("iters", result["iters"].as<int64_t>(), 1);
    options.threads = static_cast<int>(positive("threads", result["threads"].as<int>(), 0));
    options.pool_batches = positive("pool-batches", result["pool-batches"].as<int64_t>(), 1);
    options.data = choices("data", result["data"].as<std::string>(), {"synthetic", "fashion-mnist"}).front();
    options.data_dir = result["data-dir"].as<std::string>();
    if (options.data == "fashion-mnist" && options.scenario == "train") {
      for (const auto& model : options.models) {
        if (model != "lenet") throw UsageError{"--data fashion-mnist trains lenet only (1x28x28 images), not " + model};
      }
    }
    options.baseline_samples_per_s = result["baseline"].as<double>();
    if (!(options.baseline_samples_per_s >= 0)) throw UsageError{"--baseline must be >= 0"};
    options.min_bytes = positive("min-bytes", result["min-bytes"].as<int64_t>(), 4);
    options.max_bytes = positive("max-bytes", result["max-bytes"].as<int64_t>(), options.min_bytes);
    if (options.min_bytes % 4 != 0) throw UsageError{"--min-bytes must be a multiple of 4 (float32 elements)"};
    options.bucket_cap_mb = result["bucket-cap-mb"].as<double>();
    if (!(options.bucket_cap_mb > 0 && options.bucket_cap_mb <= 4096)) throw UsageError{"--bucket-cap-mb must be in (0, 4096]"};
    options.gradient_as_bucket_view = result.count("gradient-as-bucket-view") > 0;
    const auto hooks = choices("comm-hook", result["comm-hook"].as<std::string>(), {"allreduce", "fp16_compress", "bf16_compress"});
    if (hooks.size() != 1) throw UsageError{"--comm-hook takes one value, got " + std::to_string(hooks.size())};
    options.comm_hook = hooks.front();
    options.broadcast_buffers = result.count("no-broadcast-buffers") == 0;
    options.csv = result["csv"].as<std::string>();
    options.append = result.count("append") > 0;
    options.json = result["json"].as<std::string>();
    options.markdown = result.count("no-markdown") == 0;
  } catch (const cxxopts::exceptions::exception& error) {
    throw UsageError{error.what()};
  }
  return options;
}

int bench_main(int argc, char** argv, const std::string& scenario_default, int (*body)(const BenchOptions&)) {
  BenchOptions options;
  try {
    options = parse_options(argc, argv, scenario_default);
  } catch (const UsageError& error) {
    if (error.message.empty()) return 0;  // --help
    std::cerr << (argc > 0 ? argv[0] : "bench") << ": " << error.message << " (see --help)" << std::endl;
    return 2;
  }
  return body(options);
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

int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;  // the line is in kB
  }
  return 0;
}

bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

void Table::set(const std::string& column, const std::string& value) {
  const auto it = std::find(columns_.begin(), columns_.end(), column);
  if (it == columns_.end() || rows_.empty()) {
    throw std::logic_error("Table::set: no column '" + column + "' or no row");  // a bug in a scenario
  }
  rows_.back()[static_cast<std::size_t>(it - columns_.begin())] = value;
}

void Table::set(const std::string& column, double value, int decimals) { set(column, fixed(value, decimals)); }

void Table::write_csv(const std::string& path, bool append) const {
  bool header = true;
  if (append) {
    std::ifstream existing(path);
    header = !existing || existing.peek() == std::ifstream::traits_type::eof();
  }
  std::ofstream out(path, append ? std::ios::app : std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + path);
  const auto line = [&](const std::vector<std::string>& cells) {
    for (std::size_t i = 0; i < cells.size(); ++i) out << (i ? "," : "") << csv_cell(cells[i]);
    out << '\n';
  };
  if (header) line(columns_);
  for (const auto& row : rows_) line(row);
  if (!out) throw std::runtime_error("cannot write " + path);
}

void Table::write_json(const std::string& path, const std::map<std::string, std::string>& meta) const {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << "{\n  \"meta\": {";
  bool first = true;
  for (const auto& [key, value] : meta) {
    out << (first ? "" : ", ") << json_quote(key) << ": " << json_quote(value);
    first = false;
  }
  out << "},\n  \"rows\": [";
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    out << (r ? ",\n    {" : "\n    {");
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      const std::string& cell = rows_[r][c];
      out << (c ? ", " : "") << json_quote(columns_[c]) << ": " << (is_number(cell) ? cell : json_quote(cell));
    }
    out << "}";
  }
  out << "\n  ]\n}\n";
  if (!out) throw std::runtime_error("cannot write " + path);
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

void emit(const Table& table, const BenchOptions& options, const std::map<std::string, std::string>& meta,
          const std::vector<std::string>& header_lines) {
  if (options.markdown) {
    for (const auto& line : header_lines) std::cout << "# " << line << '\n';
    table.write_markdown(std::cout);
  }
  if (!options.csv.empty()) table.write_csv(options.csv, options.append);
  if (!options.json.empty()) table.write_json(options.json, meta);
}

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out += buffer;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

}  // namespace ddp::bench
