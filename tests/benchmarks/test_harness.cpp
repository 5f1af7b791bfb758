// Units of benchmarks/harness: statistics, the table writers, the command-line parser.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/harness.h"

using namespace ddp::bench;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

BenchOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddp_bench");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  return parse_options(static_cast<int>(argv.size()), argv.data(), "train");
}

std::string usage_error(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& error) {
    return error.message;
  }
  return "";
}

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path((std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()))).string()) {}
  ~TempFile() { std::filesystem::remove(path); }
};

}  // namespace

TEST_CASE("summarize: median, mean, min, max, sample standard deviation") {
  const Summary s = summarize({4, 1, 3, 2});
  CHECK(s.count == 4);
  CHECK(s.median == Approx(2.5));
  CHECK(s.mean == Approx(2.5));
  CHECK(s.min == 1);
  CHECK(s.max == 4);
  CHECK(s.stddev == Approx(1.2909944));
  CHECK(summarize({7, 1, 5}).median == 5);
  CHECK(summarize({}).count == 0);
}

TEST_CASE("PhaseTimer adds laps per phase") {
  PhaseTimer timer;
  timer.start();
  const double a = timer.lap("data");
  const double b = timer.lap("data");
  CHECK(timer.totals_ms().at("data") == Approx(a + b));
  CHECK(timer.totals_ms().size() == 1);
}

TEST_CASE("Table writes CSV (quoted where needed, header once when appending), JSON and Markdown") {
  Table table({"name", "value"});
  table.add_row();
  table.set("name", "a,b");
  table.set("value", 1.23456, 2);
  table.add_row();
  table.set("name", "plain");
  CHECK_THROWS(table.set("missing", "x"));

  TempFile csv("ddp_bench_test_csv_");
  table.write_csv(csv.path, true);
  table.write_csv(csv.path, true);
  CHECK(read(csv.path) == "name,value\n\"a,b\",1.23\nplain,\n\"a,b\",1.23\nplain,\n");
  table.write_csv(csv.path, false);
  CHECK(read(csv.path) == "name,value\n\"a,b\",1.23\nplain,\n");

  TempFile json("ddp_bench_test_json_");
  table.write_json(json.path, {{"scenario", "x\"y"}});
  CHECK(read(json.path) ==
        "{\n  \"meta\": {\"scenario\": \"x\\\"y\"},\n  \"rows\": [\n    {\"name\": \"a,b\", \"value\": 1.23},\n"
        "    {\"name\": \"plain\", \"value\": \"\"}\n  ]\n}\n");

  std::ostringstream md;
  table.write_markdown(md);
  CHECK(md.str() == "| name | value |\n|---|---|\n| a,b | 1.23 |\n| plain |  |\n");
}

TEST_CASE("parse_options: defaults, lists, and one-line errors for bad flags") {
  const BenchOptions d = parse({});
  CHECK(d.scenario == "train");
  CHECK(d.modes == std::vector<std::string>{"single", "dp", "ddp"});
  const BenchOptions o = parse({"--model", "lenet,resnet18", "--mode", "ddp", "--batch", "8,16", "--iters", "3",
                                "--max-bytes", "1024", "--csv", "x.csv", "--append", "--no-markdown"});
  CHECK(o.models == std::vector<std::string>{"lenet", "resnet18"});
  CHECK(o.batch_sizes == std::vector<int64_t>{8, 16});
  CHECK(o.iters == 3);
  CHECK(o.max_bytes == 1024);
  CHECK(o.append);
  CHECK_FALSE(o.markdown);

  CHECK(usage_error({"--model", "vgg"}).find("unknown value 'vgg'") != std::string::npos);
  CHECK(usage_error({"--batch", "0"}).find("--batch") != std::string::npos);
  CHECK(usage_error({"--iters", "0"}).find("--iters must be >= 1") != std::string::npos);
  CHECK(usage_error({"--min-bytes", "6"}).find("multiple of 4") != std::string::npos);
  CHECK(usage_error({"--nope"}) != "");
  CHECK(usage_error({"stray"}).find("stray") != std::string::npos);
  CHECK(usage_error({"--iters", "many"}) != "");
}

TEST_CASE("parse_options: --data synthetic or fashion-mnist, the latter for lenet only") {
  CHECK(parse({}).data == "synthetic");
  CHECK(parse({}).data_dir == "/usr/share/datasets/fashion-mnist");
  const BenchOptions o = parse({"--data", "fashion-mnist", "--data-dir", "/x", "--model", "lenet"});
  CHECK(o.data == "fashion-mnist");
  CHECK(o.data_dir == "/x");
  CHECK(usage_error({"--data", "imagenet"}).find("unknown value 'imagenet'") != std::string::npos);
  CHECK(usage_error({"--data", "fashion-mnist", "--model", "lenet,resnet18"}).find("lenet only") != std::string::npos);
}

TEST_CASE("parse_options: DDP's options, PyTorch's defaults unless given") {
  const BenchOptions d = parse({});
  CHECK(d.bucket_cap_mb == 25);
  CHECK_FALSE(d.gradient_as_bucket_view);
  CHECK(d.comm_hook == "allreduce");
  CHECK(d.broadcast_buffers);
  const BenchOptions o = parse({"--bucket-cap-mb", "2.5", "--gradient-as-bucket-view", "--comm-hook", "bf16_compress",
                                "--no-broadcast-buffers"});
  CHECK(o.bucket_cap_mb == 2.5);
  CHECK(o.gradient_as_bucket_view);
  CHECK(o.comm_hook == "bf16_compress");
  CHECK_FALSE(o.broadcast_buffers);
  CHECK(usage_error({"--bucket-cap-mb", "0"}).find("--bucket-cap-mb must be in (0, 4096]") != std::string::npos);
  CHECK(usage_error({"--comm-hook", "int8"}).find("unknown value 'int8'") != std::string::npos);
  CHECK(usage_error({"--comm-hook", "allreduce,bf16_compress"}).find("--comm-hook takes one value") != std::string::npos);
}

TEST_CASE("peak_rss_bytes reads VmHWM") {
  CHECK(peak_rss_bytes() > 0);
}
