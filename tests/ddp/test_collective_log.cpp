// Collective diagnostics (ddp/distributed/detail/collective_log.h): the ring buffer, its file, the arrival check with a
// map as the store, and a one-rank process group's recent_collectives().
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "ddp/distributed/detail/collective_log.h"
#include "ddp/base/worker_variables.h"
#include "ddp/distributed/process_group.h"
#include "launcher/process/net.h"
#include "tests/ddp/in_process_group.h"
#include "tests/support/temp_dir.h"

using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

ddp::CollectiveRecord record(const char* what, std::int64_t numel = 4) {
  ddp::CollectiveRecord r;
  r.op = "allreduce";
  r.what = what;
  r.numel = numel;
  r.dtype = "Float";
  r.bytes = numel * 4;
  r.start_unix_us = ddp::detail::unix_now_us();
  return r;
}

std::vector<std::int64_t> seqs(const std::vector<ddp::CollectiveRecord>& records) {
  std::vector<std::int64_t> out;
  for (const auto& r : records) out.push_back(r.seq);
  return out;
}

// A store for check_arrivals: a map behind a mutex, shared with the detached helper thread.
struct MapStore {
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::map<std::string, std::string>> keys = std::make_shared<std::map<std::string, std::string>>();
  ddp::detail::ArrivalStore store() const {
    auto m = mutex;
    auto k = keys;
    return {[m, k](const std::string& key, const std::string& value) {
              std::lock_guard<std::mutex> lock(*m);
              (*k)[key] = value;
            },
            [m, k](const std::string& key) -> std::optional<std::string> {
              std::lock_guard<std::mutex> lock(*m);
              auto it = k->find(key);
              if (it == k->end()) return std::nullopt;
              return it->second;
            }};
  }
  void set(int rank, std::int64_t seq, const std::string& what = "gradient all-reduce") {
    std::lock_guard<std::mutex> lock(*mutex);
    (*keys)[ddp::detail::arrival_key(rank)] = std::to_string(seq) + " " + what;
  }
};

const std::string kGrad = "gradient all-reduce";

std::optional<ddp::detail::Arrival> arrived(std::int64_t seq, const std::string& what = kGrad) { return ddp::detail::Arrival{seq, what}; }
const std::optional<ddp::detail::Arrival> none;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("the collective ring buffer keeps the last N collectives in order", "[collective_log]") {
  SECTION("before wrapping around") {
    ddp::detail::CollectiveLog log(4);
    CHECK(log.last_seq() == 0);
    CHECK(log.snapshot().empty());
    CHECK(log.begin(record("a")) == 1);
    CHECK(log.begin(record("b")) == 2);
    const auto held = log.snapshot();
    CHECK(seqs(held) == std::vector<std::int64_t>{1, 2});
    CHECK(std::string(held[0].what) == "a");
    CHECK(held[1].state == ddp::CollectiveState::kStarted);
    CHECK(held[1].end_unix_us == 0);
  }
  SECTION("wrap-around: the oldest are overwritten, the order stays oldest first") {
    ddp::detail::CollectiveLog log(4);
    for (int i = 0; i < 10; ++i) log.begin(record(i % 2 == 0 ? "even" : "odd", i + 1));
    CHECK(log.last_seq() == 10);
    const auto held = log.snapshot();
    CHECK(seqs(held) == std::vector<std::int64_t>{7, 8, 9, 10});
    CHECK(held.front().numel == 7);
    CHECK(std::string(held.back().what) == "odd");
    CHECK_FALSE(log.find(6));
    CHECK_FALSE(log.finish(6, ddp::CollectiveState::kCompleted));  // overwritten: nothing to mark
    REQUIRE(log.find(7));
    CHECK(log.finish(7, ddp::CollectiveState::kCompleted));
    CHECK(log.find(7)->state == ddp::CollectiveState::kCompleted);
    CHECK(log.find(7)->end_unix_us >= log.find(7)->start_unix_us);
    CHECK(log.last_completed() == 7);
    CHECK(log.finish(10, ddp::CollectiveState::kFailed));
    CHECK(log.snapshot().back().state == ddp::CollectiveState::kFailed);
    CHECK_FALSE(log.find(11));
    CHECK_FALSE(log.find(0));
  }
  SECTION("size 0 keeps nothing but still numbers the collectives") {
    ddp::detail::CollectiveLog log(0);
    CHECK(log.capacity() == 0);
    CHECK(log.begin(record("a")) == 1);
    CHECK(log.begin(record("b")) == 2);
    CHECK(log.last_seq() == 2);
    CHECK(log.snapshot().empty());
    CHECK_FALSE(log.finish(2, ddp::CollectiveState::kCompleted));
    log.attach(2, &log);
    CHECK_FALSE(log.find_started(&log));
    CHECK(log.last_completed() == 0);
  }
  SECTION("size 1 keeps the newest") {
    ddp::detail::CollectiveLog log(1);
    for (int i = 0; i < 3; ++i) log.begin(record("x"));
    CHECK(seqs(log.snapshot()) == std::vector<std::int64_t>{3});
  }
  SECTION("a started collective is found by its work object, newest first") {
    ddp::detail::CollectiveLog log(8);
    int work_a = 0, work_b = 0;
    const auto s1 = log.begin(record("a"));
    log.attach(s1, &work_a);
    const auto s2 = log.begin(record("b"));
    log.attach(s2, &work_b);
    CHECK(log.find_started(&work_a) == s1);
    CHECK(log.find_started(&work_b) == s2);
    log.finish(s1, ddp::CollectiveState::kCompleted);
    CHECK_FALSE(log.find_started(&work_a));  // completed: a reused address must not match it
    const auto s3 = log.begin(record("c"));
    log.attach(s3, &work_a);  // the same address again, for a later collective
    CHECK(log.find_started(&work_a) == s3);
  }
}

TEST_CASE("the ring buffer file is JSON, one collective per line, oldest first", "[collective_log]") {
  ddp::detail::CollectiveLog log(3);
  for (int i = 0; i < 5; ++i) {
    auto r = record("gradient all-reduce", 100 + i);
    r.bucket = i % 2;
    const auto seq = log.begin(r);
    if (i < 4) log.finish(seq, ddp::CollectiveState::kCompleted);
  }
  ddp::detail::CollectiveDumpHeader header;
  header.rank = 1;
  header.world_size = 2;
  header.backend = "gloo";
  header.reason = "gradient all-reduce #5 timed out: \"quoted\"\nsecond line";
  header.last_seq = log.last_seq();
  header.capacity = log.capacity();
  const std::string text = ddp::detail::collectives_json(header, log.snapshot());
  CHECK(std::count(text.begin(), text.end(), '\n') == 3 + 3 + 1);  // 3 header lines, one per record, the end
  const auto root = nlohmann::json::parse(text, nullptr, false);
  REQUIRE_FALSE(root.is_discarded());
  CHECK(root.at("rank") == 1);
  CHECK(root.at("world_size") == 2);
  CHECK(root.at("last_seq") == 5);
  CHECK(root.at("capacity") == 3);
  CHECK(root.at("reason") == header.reason);
  const auto& items = root.at("collectives");
  REQUIRE(items.size() == 3);
  CHECK(items[0].at("seq") == 3);
  CHECK(items[2].at("seq") == 5);
  CHECK(items[2].at("state") == "started");
  CHECK(items[1].at("state") == "completed");
  CHECK(items[2].at("op") == "allreduce");
  CHECK(items[2].at("what") == "gradient all-reduce");
  CHECK(items[2].at("bucket") == 0);
  CHECK(items[2].at("numel") == 104);
  CHECK(items[2].at("bytes") == 416);
  CHECK(items[2].at("dtype") == "Float");

  SECTION("an empty ring is valid JSON too") {
    const auto empty = nlohmann::json::parse(ddp::detail::collectives_json(header, {}), nullptr, false);
    REQUIRE_FALSE(empty.is_discarded());
    CHECK(empty.at("collectives").empty());
  }
  SECTION("written atomically to <dir>/collectives-rank<R>.json, creating the folder") {
    ddp::testing::TempDir dir;
    const auto path = ddp::detail::write_collectives_file(dir / "a/b", 1, text);
    REQUIRE(path);
    CHECK(*path == dir / "a/b/collectives-rank1.json");
    std::ifstream in(*path);
    std::stringstream read;
    read << in.rdbuf();
    CHECK(read.str() == text);
    CHECK_FALSE(std::filesystem::exists(*path + ".tmp"));
    CHECK_FALSE(ddp::detail::write_collectives_file("/proc/no/such/folder", 1, text));
  }
}

TEST_CASE("byte counts read as B, KiB, MiB", "[collective_log]") {
  CHECK(ddp::detail::format_bytes(0) == "0 B");
  CHECK(ddp::detail::format_bytes(580) == "580 B");
  CHECK(ddp::detail::format_bytes(1536) == "1.5 KiB");
  CHECK(ddp::detail::format_bytes(1258291) == "1.2 MiB");
  CHECK(ddp::detail::format_bytes(std::int64_t{3} << 30) == "3.0 GiB");
}

TEST_CASE("arrival reports name the ranks that did not arrive", "[collective_log][arrivals]") {
  SECTION("classification against this rank's sequence number") {
    const auto report = ddp::detail::classify_arrivals(0, {37, kGrad}, {arrived(37), none, arrived(36), arrived(38), arrived(37), arrived(37, "barrier")});
    CHECK(report.silent == std::vector<int>{1});
    CHECK(report.behind == std::vector<std::pair<int, std::int64_t>>{{2, 36}});
    CHECK(report.ahead == std::vector<std::pair<int, std::int64_t>>{{3, 38}});
    CHECK(report.mismatched == std::vector<std::pair<int, std::string>>{{5, "barrier"}});
    CHECK_FALSE(report.all_arrived());
    CHECK(ddp::detail::classify_arrivals(1, {9, kGrad}, {arrived(9), arrived(9)}).all_arrived());
  }
  SECTION("messages") {
    ddp::detail::ArrivalReport report = ddp::detail::classify_arrivals(0, {37, kGrad}, {arrived(37), arrived(36)});
    CHECK(ddp::detail::describe_arrivals(report) == "rank(s) 1 did not arrive (rank 1 last entered collective #36)");
    report = ddp::detail::classify_arrivals(0, {37, kGrad}, {arrived(37), none, arrived(37)});
    report.window = 2000ms;
    CHECK_THAT(ddp::detail::describe_arrivals(report),
               Contains("rank(s) 1 did not arrive (rank 1 sent no report within 2 s: not inside any collective"));
    report.last_completed = 36;
    CHECK_THAT(ddp::detail::describe_arrivals(report), Contains("(busy, hung, or gone); #36 was the last to complete here)"));
    report = ddp::detail::classify_arrivals(2, {5, kGrad}, {none, arrived(4), arrived(5), arrived(6)});
    report.window = 500ms;
    const auto text = ddp::detail::describe_arrivals(report);
    CHECK_THAT(text, Contains("rank(s) 0, 1 did not arrive (rank 1 last entered collective #4; rank 0 sent no report"));
    CHECK_THAT(text, Contains("rank 3 is at collective #6 (it finished this collective, which still waits here"));
    CHECK(ddp::detail::describe_arrivals(ddp::detail::classify_arrivals(0, {5, kGrad}, {arrived(5), arrived(6)})) ==
          "rank 1 is at collective #6 (this rank is behind: a desync)");
    CHECK_THAT(ddp::detail::describe_arrivals(ddp::detail::classify_arrivals(1, {9, kGrad}, {arrived(9), arrived(9)})),
               Contains("every rank reported"));
    CHECK(ddp::detail::describe_arrivals(ddp::detail::classify_arrivals(0, {7, kGrad}, {arrived(7), arrived(7, "barrier")})) ==
          "rank 1 is in barrier under the same number, this rank in gradient all-reduce (a desync: the ranks "
          "issued different collectives; compare their collectives-rank*.json)");
  }
}

// Note [Collectives end unevenly]: rank 2 cut off in #18; rank 0 completed #18 and timed out in
// #19, rank 1 timed out in #18. Each names rank 2 alone.
TEST_CASE("a rank still inside a collective that completed here is not named as missing", "[collective_log][arrivals]") {
  const auto completed_up_to = [](std::int64_t last) { return [last](std::int64_t seq) { return seq <= last; }; };
  ddp::detail::ArrivalReport on_rank0 = ddp::detail::classify_arrivals(0, {19, kGrad}, {arrived(19), arrived(18), none});
  on_rank0.window = 2000ms;
  ddp::detail::separate_still_inside(on_rank0, completed_up_to(18));
  CHECK(on_rank0.behind.empty());
  CHECK(on_rank0.still_inside == std::vector<std::pair<int, std::int64_t>>{{1, 18}});
  CHECK_FALSE(on_rank0.all_arrived());
  const auto text0 = ddp::detail::describe_arrivals(on_rank0);
  CHECK_THAT(text0, Contains("rank(s) 2 did not arrive (rank 2 sent no report within 2 s"));
  CHECK_THAT(text0, Contains("; rank 1 is still inside collective #18, which completed here"));
  // Global ranks in a sub-group: the separated rank is renamed too.
  CHECK(ddp::detail::in_global_ranks(on_rank0, [](int r) { return r + 10; }).still_inside ==
        std::vector<std::pair<int, std::int64_t>>{{11, 18}});

  ddp::detail::ArrivalReport on_rank1 = ddp::detail::classify_arrivals(1, {18, kGrad}, {arrived(19), arrived(18), none});
  on_rank1.window = 2000ms;
  ddp::detail::separate_still_inside(on_rank1, completed_up_to(17));
  const auto text1 = ddp::detail::describe_arrivals(on_rank1);
  CHECK_THAT(text1, Contains("rank(s) 2 did not arrive"));
  CHECK_THAT(text1, Contains("rank 0 is at collective #19 (it finished this collective"));
  CHECK_THAT(text1, !Contains("desync"));

  // A rank behind in a collective that did not complete here is still missing (a desync, or gone).
  ddp::detail::ArrivalReport skipped = ddp::detail::classify_arrivals(0, {19, kGrad}, {arrived(19), arrived(17)});
  ddp::detail::separate_still_inside(skipped, completed_up_to(16));
  CHECK(skipped.behind == std::vector<std::pair<int, std::int64_t>>{{1, 17}});
  CHECK(ddp::detail::describe_arrivals(skipped) == "rank(s) 1 did not arrive (rank 1 last entered collective #17)");
}

TEST_CASE("check_arrivals publishes this rank's number and waits a bounded time for the others",
          "[collective_log][arrivals]") {
  MapStore map;
  SECTION("everybody reports: it returns at once") {
    map.set(0, 12);
    map.set(2, 11);
    const auto start = std::chrono::steady_clock::now();
    const auto report = ddp::detail::check_arrivals(map.store(), 1, 3, {12, kGrad}, 5000ms);
    CHECK(seconds_since(start) < 2.0);
    CHECK(report.silent.empty());
    CHECK(report.behind == std::vector<std::pair<int, std::int64_t>>{{2, 11}});
    CHECK(map.keys->at(ddp::detail::arrival_key(1)) == "12 gradient all-reduce");  // published
  }
  SECTION("a rank that never reports is named after the window") {
    map.set(0, 12);
    const auto start = std::chrono::steady_clock::now();
    const auto report = ddp::detail::check_arrivals(map.store(), 1, 3, {12, kGrad}, 300ms);
    const double took = seconds_since(start);
    CHECK(took >= 0.29);
    CHECK(took < 1.3);
    CHECK(report.silent == std::vector<int>{2});
    CHECK_FALSE(report.store_failed);
  }
  SECTION("a rank that reports during the window is seen") {
    std::thread late([&] {
      std::this_thread::sleep_for(100ms);
      map.set(0, 12);
    });
    const auto report = ddp::detail::check_arrivals(map.store(), 1, 2, {12, kGrad}, 3000ms);
    late.join();
    CHECK(report.all_arrived());
  }
  SECTION("the store's host lingers while a rank that reported has not finished reading") {
    map.set(1, 12, "barrier");
    const auto start = std::chrono::steady_clock::now();
    const auto report = ddp::detail::check_arrivals(map.store(), 0, 2, {12, kGrad}, 300ms, /*linger=*/true);
    // window + kArrivalLingerSlack: a rank that timed out up to 1 s later still reads the store.
    const double took = seconds_since(start);
    const double slack = std::chrono::duration<double>(ddp::detail::kArrivalLingerSlack).count();
    CHECK(took >= 0.29 + slack);
    CHECK(took < 1.3 + slack);
    CHECK(report.mismatched == std::vector<std::pair<int, std::string>>{{1, "barrier"}});
  }
  SECTION("the store's host leaves at its window's end once the ranks that reported finished reading") {
    map.set(1, 12);
    std::thread reader([&] {
      std::this_thread::sleep_for(500ms);
      std::lock_guard<std::mutex> lock(*map.mutex);
      (*map.keys)[ddp::detail::arrival_done_key(1)] = "1";
    });
    const auto start = std::chrono::steady_clock::now();
    const auto report = ddp::detail::check_arrivals(map.store(), 0, 3, {12, kGrad}, 300ms, /*linger=*/true);
    const double took = seconds_since(start);
    reader.join();
    CHECK(took >= 0.49);  // waited for rank 1, which reported, but not for silent rank 2
    CHECK(took < 0.9);
    CHECK(report.silent == std::vector<int>{2});
    CHECK_FALSE(report.store_failed);
  }
  SECTION("a rank that is not the host says when it finished reading") {
    map.set(0, 12);
    const auto report = ddp::detail::check_arrivals(map.store(), 1, 2, {12, kGrad}, 3000ms);
    CHECK(report.all_arrived());
    std::lock_guard<std::mutex> lock(*map.mutex);
    CHECK(map.keys->count(ddp::detail::arrival_done_key(1)) == 1);
    CHECK(map.keys->count(ddp::detail::arrival_done_key(0)) == 0);
  }
  SECTION("a store that throws: every other rank is unknown, and it says so") {
    ddp::detail::ArrivalStore broken{[](const std::string&, const std::string&) { throw std::runtime_error("connection reset"); },
                             [](const std::string&) -> std::optional<std::string> { return std::nullopt; }};
    const auto report = ddp::detail::check_arrivals(broken, 0, 2, {3, kGrad}, 1000ms);
    CHECK(report.store_failed);
    CHECK(report.silent == std::vector<int>{1});
    CHECK_THAT(ddp::detail::describe_arrivals(report), Contains("the store did not answer"));
  }
  SECTION("a store whose host leaves during the window: the report says how long it answered") {
    const auto start = std::chrono::steady_clock::now();
    const ddp::detail::ArrivalStore inner = map.store();
    const ddp::detail::ArrivalStore leaving{inner.set, [inner, start](const std::string& key) -> std::optional<std::string> {
                                      if (seconds_since(start) > 0.4) throw std::runtime_error("Failed to recv");
                                      return inner.get(key);
                                    }};
    const auto report = ddp::detail::check_arrivals(leaving, 1, 2, {3, kGrad}, 2000ms);
    CHECK(seconds_since(start) < 1.5);
    CHECK(report.store_failed);
    CHECK(report.silent == std::vector<int>{0});
    CHECK(report.answered >= 300ms);
    CHECK(report.answered <= 500ms);
    CHECK_THAT(ddp::detail::describe_arrivals(report),
               Contains("rank(s) 0 did not arrive (rank 0 sent no report within 0.") &&
                   Contains(" s (then the store stopped answering: its host left): not inside any collective"));
  }
  SECTION("a store that blocks cannot turn the check into a hang") {
    ddp::detail::ArrivalStore stuck{[](const std::string&, const std::string&) { std::this_thread::sleep_for(3s); },
                            [](const std::string&) -> std::optional<std::string> { return std::nullopt; }};
    const auto start = std::chrono::steady_clock::now();
    const auto report = ddp::detail::check_arrivals(stuck, 0, 2, {3, kGrad}, 200ms);
    CHECK(seconds_since(start) < 2.0);  // window + 1 s at most
    CHECK(report.store_failed);
  }
}

TEST_CASE("diagnostics go to DDP_LOG_DIR, else next to the error file", "[collective_log][environment]") {
  const auto env = [](std::map<std::string, std::string> vars) {
    return ddp::EnvironmentSnapshot::from_map(std::move(vars)).lookup();
  };
  CHECK(ddp::diagnostics_dir(env({})).empty());
  CHECK(ddp::diagnostics_dir(env({{"TORCHELASTIC_ERROR_FILE", "/runs/x/attempt_0/1/error.json"}})) ==
        "/runs/x/attempt_0/1");
  CHECK(ddp::diagnostics_dir(env({{"TORCHELASTIC_ERROR_FILE", "error.json"}})) == ".");
  CHECK(ddp::diagnostics_dir(env({{"DDP_LOG_DIR", "/logs/a"}, {"TORCHELASTIC_ERROR_FILE", "/e/error.json"}})) ==
        "/logs/a");
  CHECK(ddp::diagnostics_dir(env({{"DDP_LOG_DIR", ""}, {"TORCHELASTIC_ERROR_FILE", "/e/error.json"}})) == "/e");
}

TEST_CASE("every collective of a process group is numbered and recorded", "[collective_log][process_group]") {
  ddp::testing::TempDir dir;
  ddp::InitOptions init;
  init.backend = "gloo";
  init.init_method = "file://" + (dir / "store");
  init.rank = 0;
  init.world_size = 1;
  init.timeout = 10s;
  auto group = ddp::init_process_group(init);
  CHECK(group->last_collective_seq() == 0);
  auto t = torch::ones({3, 5});
  group->allreduce(t);
  group->broadcast(t, 0, "buffer broadcast");
  group->allgather(torch::ones({2}, torch::kDouble));
  group->barrier();
  auto work = group->allreduce_async(t, "gradient all-reduce", 3);
  CHECK(group->recent_collectives().back().state == ddp::CollectiveState::kStarted);
  group->wait(work, "gradient all-reduce");

  const auto held = group->recent_collectives();
  REQUIRE(held.size() == 5);
  CHECK(seqs(held) == std::vector<std::int64_t>{1, 2, 3, 4, 5});
  CHECK(group->last_collective_seq() == 5);
  const std::vector<std::string> ops{"allreduce", "broadcast", "allgather", "barrier", "allreduce"};
  for (std::size_t i = 0; i < held.size(); ++i) {
    CHECK(held[i].op == ops[i]);
    CHECK(held[i].state == ddp::CollectiveState::kCompleted);
    CHECK(held[i].end_unix_us >= held[i].start_unix_us);
  }
  CHECK(std::string(held[1].what) == "buffer broadcast");
  CHECK(held[0].numel == 15);
  CHECK(held[0].bytes == 60);
  CHECK(std::string(held[0].dtype) == "Float");
  CHECK(std::string(held[2].dtype) == "Double");
  CHECK(held[2].bytes == 16);
  CHECK(held[3].bytes == 0);
  CHECK(held[4].bucket == 3);
  CHECK(std::string(held[4].what) == "gradient all-reduce");
}

// Note [Gloo's timeout is a backstop] in ddp/distributed/process_group.cpp: rank 1 issues a barrier
// that rank 0 never issues; rank 0 enters its all-reduce under the same number 400 ms later, as a
// loaded machine staggers ranks. Both time out and name the desync. When Gloo's own bound was the
// group's timeout, rank 1's barrier closed its connections at rank 1's timeout and rank 0 failed
// with "Connection closed by peer" before its own (faults.diag, once in a soak round).
TEST_CASE("a desync is named by a rank that entered its collective later, not hidden by the first rank's timeout",
          "[collective_log][process_group][arrivals]") {
  struct Seen {
    std::string message;
    bool timed_out = false;
  };
  const auto seen = ddp::testing::run_ranks<Seen>(
      2,
      [](ddp::ProcessGroup& group) {
        Seen out;
        try {
          if (group.rank() == 1) {
            group.barrier();
          } else {
            std::this_thread::sleep_for(400ms);
            auto t = torch::ones({4});
            group.allreduce(t);
          }
        } catch (const ddp::TimeoutError& error) {
          out.message = error.what();
          out.timed_out = true;
        } catch (const std::exception& error) {
          out.message = error.what();
        }
        return out;
      },
      1000ms);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << seen[static_cast<std::size_t>(rank)].message);
    CHECK(seen[static_cast<std::size_t>(rank)].timed_out);
    CHECK_THAT(seen[static_cast<std::size_t>(rank)].message, Contains("under the same number") && Contains("a desync"));
  }
  CHECK_THAT(seen[0].message, Contains("rank 1 is in barrier"));
}

namespace {

// The local addresses (hex, as the kernel writes them) of the sockets listening on `port`.
std::vector<std::string> listening_addresses(int port) {
  std::vector<std::string> found;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos && std::stoi(local.substr(colon + 1), nullptr, 16) == port) {
        found.push_back(local.substr(0, colon));
      }
    }
  }
  return found;
}

}  // namespace

TEST_CASE("a store for a loopback master listens on loopback only (see Note [Loopback store])", "[process_group]") {
  const int port = ddp::launcher::process::pick_free_port("127.0.0.1");
  ddp::InitOptions init;
  init.backend = "gloo";
  init.init_method = "tcp://127.0.0.1:" + std::to_string(port);
  init.rank = 0;
  init.world_size = 1;
  init.timeout = 10s;
  auto group = ddp::init_process_group(init);
  const auto addresses = listening_addresses(port);
  INFO("listening on port " << port << ": " << Catch::Detail::stringify(addresses));
  REQUIRE_FALSE(addresses.empty());
  for (const auto& address : addresses) CHECK(address == "0100007F");  // 127.0.0.1; never 00000000 or ::
  auto t = torch::ones({4});
  group->allreduce(t);
  CHECK(t.sum().item<float>() == 4.0f);
}
