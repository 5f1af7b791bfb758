// Units of benchmarks/harness: statistics, the table writers, the command-line parser.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchmarks/harness.h"
#include "ddp/base/detail/process_memory.h"

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
  } catch (const ddp::UsageError& error) {
    return error.what();
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
  const auto document = nlohmann::json::parse(read(json.path));
  CHECK(document["meta"] == nlohmann::json{{"scenario", "x\"y"}});
  REQUIRE(document["rows"].size() == 2);
  CHECK(document["rows"][0]["name"] == "a,b");
  CHECK(document["rows"][0]["value"].is_number());  // numeric cells are JSON numbers
  CHECK(document["rows"][0]["value"] == 1.23);
  CHECK(document["rows"][1] == nlohmann::json{{"name", "plain"}, {"value", ""}});
  // Columns keep the table's order.
  CHECK(read(json.path).find("\"name\": \"a,b\",\n      \"value\": 1.23") != std::string::npos);

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
  CHECK(ddp::detail::peak_rss_bytes() > 0);
}

namespace {

// A command line of the shape every benchmark builds: its own flags, then the harness's.
std::string command_line_error(std::vector<std::string> args) {
  args.insert(args.begin(), "bench");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  CommandLine cli("bench", "test");
  cli.add("model", "", "lenet");
  cli.add("numel", "", "161");
  cli.add("batch", "", "8,16");
  cli.add_harness_flags(TimingOptions{3, 7}, "reps");
  try {
    cli.parse(static_cast<int>(argv.size()), argv.data());
    cli.choice("model", {"lenet", "resnet18"});
    cli.integer("numel", 1, 1000);
    cli.integers("batch", 1);
    cli.timing();
  } catch (const ddp::UsageError& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("CommandLine: the harness's flags, the benchmark's own, and one-line usage errors") {
  std::vector<std::string> args{"bench", "--numel", "5", "--reps", "4", "--json", "out.json", "--no-markdown"};
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  CommandLine cli("bench", "test");
  cli.add("numel", "", "161");
  cli.add_switch("fast", "");
  cli.add_harness_flags(TimingOptions{3, 7}, "reps");
  cli.parse(static_cast<int>(argv.size()), argv.data());
  CHECK(cli.integer("numel", 1) == 5);
  CHECK_FALSE(cli.given("fast"));
  CHECK(cli.timing().warmup == 3);
  CHECK(cli.timing().iters == 4);
  CHECK(cli.output().json == "out.json");
  CHECK(cli.output().csv.empty());
  CHECK_FALSE(cli.output().markdown);

  CHECK(command_line_error({}).empty());
  CHECK_THAT(command_line_error({"--model", "vgg"}), Catch::Contains("--model: unknown value 'vgg'"));
  CHECK_THAT(command_line_error({"--model", "lenet,resnet18"}), Catch::Contains("--model takes one value"));
  CHECK_THAT(command_line_error({"--numel", "0"}), Catch::Contains("--numel must be >= 1, got 0"));
  CHECK_THAT(command_line_error({"--numel", "2000"}), Catch::Contains("--numel must be <= 1000"));
  CHECK_THAT(command_line_error({"--numel", "12x"}), Catch::Contains("'12x' is not an integer"));
  CHECK_THAT(command_line_error({"--numel", "99999999999999999999"}), Catch::Contains("is not an integer"));
  CHECK_THAT(command_line_error({"--batch", "8,-1"}), Catch::Contains("--batch: '-1'"));
  CHECK_THAT(command_line_error({"--reps", "0"}), Catch::Contains("--reps must be >= 1"));
  CHECK_THAT(command_line_error({"--iters", "3"}), Catch::Contains("iters"));  // this benchmark calls it --reps
  CHECK_THAT(command_line_error({"stray"}), Catch::Contains("unexpected argument 'stray'"));
}

TEST_CASE("with_usage: a usage error is one line and kUsageExitCode, --help is 0, other errors propagate") {
  CHECK(with_usage("bench", [] { return 7; }) == 7);
  CHECK(with_usage("bench", []() -> int { throw ddp::UsageError("--x is bad"); }) == ddp::kUsageExitCode);
  CHECK(with_usage("bench", []() -> int { throw HelpShown{}; }) == 0);
  CHECK_THROWS_AS(with_usage("bench", []() -> int { throw ddp::IoError("disk"); }), ddp::IoError);
}

TEST_CASE("time_iterations and time_loop run the warm-up first, then the timed iterations") {
  int calls = 0;
  const auto samples = time_iterations(TimingOptions{2, 5}, [&] { ++calls; });
  CHECK(calls == 7);
  CHECK(samples.size() == 5);
  for (double s : samples) CHECK(s >= 0);
  calls = 0;
  CHECK(time_loop(TimingOptions{1, 3}, [&] { ++calls; }) >= 0);
  CHECK(calls == 4);
}

TEST_CASE("Table writers replace a planted symlink instead of writing through it") {
  TempFile victim("ddp_bench_test_victim_"), csv("ddp_bench_test_link_csv_"), json("ddp_bench_test_link_json_");
  { std::ofstream(victim.path) << "precious\n"; }
  std::filesystem::create_symlink(victim.path, csv.path);
  std::filesystem::create_symlink(victim.path, json.path);
  Table table({"a"});
  table.add_row();
  table.set("a", "1");
  table.write_csv(csv.path, /*append=*/false);
  table.write_json(json.path, {});
  CHECK(read(victim.path) == "precious\n");
  CHECK_FALSE(std::filesystem::is_symlink(csv.path));
  CHECK(read(csv.path) == "a\n1\n");
  CHECK_FALSE(std::filesystem::is_symlink(json.path));
}
