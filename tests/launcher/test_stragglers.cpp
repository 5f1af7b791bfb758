// Unit tests of the straggler detector (launcher/observe/straggler.h, Note [Stragglers]) and of its
// place on the progress board: heartbeats in, standings, the job channel's text and /metrics out.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <random>

#include "launcher/observe/progress_board.h"
#include "launcher/observe/straggler.h"

using namespace ddp::launcher::observe;
using Catch::Matchers::Contains;

namespace {

// One synchronized iteration of `busy` seconds per rank: every rank leaves the all-reduce together,
// so a rank waits for the slowest one's extra time plus the transfer.
void iteration(StragglerDetector& d, std::int64_t step, const std::vector<double>& busy, double transfer = 0.002) {
  double slowest = 0;
  for (double b : busy) slowest = std::max(slowest, b);
  for (std::size_t r = 0; r < busy.size(); ++r) {
    d.add(static_cast<int>(r), {step, busy[r], slowest - busy[r] + transfer});
  }
}

// By value: a pointer into standings()'s temporary vector dangled (ASan in CI, stop 51).
std::optional<RankStanding> standing_of(const std::vector<RankStanding>& all, int rank) {
  for (const auto& s : all) {
    if (s.rank == rank) return s;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("stragglers: an even job is never named, a slow rank is named within the window", "[stragglers]") {
  StragglerDetector d({1.5, 50});
  std::mt19937 random(7);
  std::uniform_real_distribution<double> jitter(0.7, 1.3);  // +-30% per step and rank
  std::int64_t step = 1;
  for (; step < 50; ++step) iteration(d, step, {0.1 * jitter(random), 0.1 * jitter(random), 0.1 * jitter(random)});
  CHECK(d.standings().empty());  // 49 complete steps: no verdict yet
  double highest = 0;
  for (; step <= 1000; ++step) {
    iteration(d, step, {0.1 * jitter(random), 0.1 * jitter(random), 0.1 * jitter(random)});
    const auto all = d.standings();
    REQUIRE(all.size() == 3);
    for (const auto& s : all) {
      CHECK_FALSE(s.straggler);
      highest = std::max(highest, s.ratio);
    }
  }
  CHECK(highest < 1.2);
  // From step 1001, rank 2's steps take 1.9 times as long.
  const std::int64_t slowed = step;
  std::int64_t named_at = 0;
  for (; step < slowed + 50; ++step) {
    iteration(d, step, {0.1, 0.1, 0.19});
    const auto s = standing_of(d.standings(), 2);
    REQUIRE(s);
    if (s->straggler && named_at == 0) named_at = step;
  }
  CHECK(named_at >= slowed + 24);  // medians: once half the window is slow (steps slowed..slowed + 24)
  CHECK(named_at < slowed + 50);
  const auto all = d.standings();
  const auto slow = standing_of(all, 2);
  REQUIRE(slow);
  CHECK(slow->ratio == Approx(1.9));
  CHECK(slow->last_share == 1.0);
  CHECK(describe_straggler(*slow, 50, "rank 2 on host2") ==
        "rank 2 on host2: steps 1.9x the median for the last 50 (steps 1001-1050); last to arrive in 100% of "
        "all-reduces");
  for (int fast : {0, 1}) {
    CHECK_FALSE(standing_of(all, fast)->straggler);
    CHECK(standing_of(all, fast)->ratio == Approx(0.1 / 0.145));  // the median of 0.1 and 0.19
    CHECK(standing_of(all, fast)->last_share == 0.0);
  }
}

TEST_CASE("stragglers: a stall of one rank in one step names nobody", "[stragglers]") {
  // hosts.straggler beside a benchmark: an even job's rank 1 read 1.6x for a window with a mean
  // over it; one 0.5 s stall among 4 ms steps does that. The median does not move.
  StragglerDetector d({1.5, 50});
  for (std::int64_t step = 1; step <= 200; ++step) {
    iteration(d, step, {0.004, step == 120 ? 0.5 : 0.004, 0.004});
    for (const auto& s : d.standings()) CHECK_FALSE(s.straggler);
  }
  // Slow in a third of the window's steps is no straggler either; in most of them it is.
  StragglerDetector third({1.5, 50});
  for (std::int64_t step = 1; step <= 100; ++step) iteration(third, step, {0.004, step % 3 == 0 ? 0.02 : 0.004});
  CHECK_FALSE(standing_of(third.standings(), 1)->straggler);
  for (std::int64_t step = 101; step <= 200; ++step) iteration(third, step, {0.004, step % 3 == 0 ? 0.004 : 0.02});
  CHECK(standing_of(third.standings(), 1)->straggler);
}

TEST_CASE("stragglers: two ranks compare with each other; incomplete, foreign and restarted ranks", "[stragglers]") {
  StragglerDetector two({1.5, 10});
  for (std::int64_t step = 1; step <= 10; ++step) iteration(two, step, {0.1, 0.2});
  const auto pair = two.standings();
  REQUIRE(pair.size() == 2);
  CHECK(standing_of(pair, 1)->ratio == Approx(2.0));  // the other's mean, not the median of both (1.33x)
  CHECK(standing_of(pair, 1)->straggler);
  CHECK(standing_of(pair, 0)->ratio == Approx(0.5));

  // A step a rank did not report (a dropped heartbeat) is left out; the window takes older steps.
  StragglerDetector gaps({1.5, 10});
  for (std::int64_t step = 1; step <= 12; ++step) {
    gaps.add(0, {step, 0.1, 0.1});
    if (step % 6 != 0) gaps.add(1, {step, 0.2, 0.0});
  }
  REQUIRE(gaps.standings().size() == 2);
  for (std::int64_t step = 13; step <= 15; ++step) gaps.add(0, {step, 0.1, 0.1});  // rank 1 silent
  CHECK(gaps.standings().size() == 2);  // within one window of the newest: still current
  for (std::int64_t step = 16; step <= 40; ++step) gaps.add(0, {step, 0.1, 0.1});
  CHECK(gaps.standings().empty());  // rank 1 fell a window behind: one current rank, no verdict

  // A rank that started over (a live respawn counts from step 1) drops out; the others go on.
  StragglerDetector restarted({1.5, 10});
  for (std::int64_t step = 1; step <= 30; ++step) iteration(restarted, step, {0.1, 0.1, 0.1});
  restarted.forget(2);
  for (std::int64_t step = 1; step <= 5; ++step) restarted.add(2, {step, 0.5, 0.0});
  const auto after = restarted.standings();
  REQUIRE(after.size() == 2);
  CHECK_FALSE(standing_of(after, 2));

  // In a live job a spare takes a straggler's place at the job's step: the others' standings go on
  // (the straggler named until its steps age out) while the newcomer gathers a window of its own.
  StragglerDetector replaced({1.5, 10});
  for (std::int64_t step = 1; step <= 20; ++step) iteration(replaced, step, {0.1, 0.1, step > 10 ? 0.4 : 0.1});
  REQUIRE(standing_of(replaced.standings(), 2)->straggler);
  for (std::int64_t step = 21; step <= 29; ++step) {  // rank 2 gone; rank 9 (the spare) from step 21
    replaced.add(0, {step, 0.1, 0.0});
    replaced.add(1, {step, 0.1, 0.0});
    replaced.add(9, {step, 0.1, 0.0});
    const auto meanwhile = replaced.standings();
    REQUIRE(meanwhile.size() == 3);
    CHECK(standing_of(meanwhile, 2)->straggler);
    CHECK_FALSE(standing_of(meanwhile, 9));
  }
  for (std::int64_t step = 30; step <= 31; ++step) iteration(replaced, step, {0.1, 0.1});
  for (std::int64_t step = 30; step <= 31; ++step) replaced.add(9, {step, 0.1, 0.0});
  const auto later = replaced.standings();  // rank 2 a window behind; rank 9 has its window
  REQUIRE(later.size() == 3);
  CHECK_FALSE(standing_of(later, 2));
  CHECK(standing_of(later, 9));
}

TEST_CASE("stragglers: the job channel's text round-trips and skips what cannot be", "[stragglers]") {
  const std::vector<std::pair<int, StepTiming>> timings{{3, {17, 0.25, 0.0125}}, {0, {18, 1.5, 0}}};
  const std::string text = encode_timings(timings);
  CHECK(text == "3:17:250000:12500,0:18:1500000:0");
  const auto back = decode_timings(text);
  REQUIRE(back.size() == 2);
  CHECK(back[0].first == 3);
  CHECK(back[0].second.step == 17);
  CHECK(back[0].second.busy_s == 0.25);
  CHECK(back[0].second.wait_s == 0.0125);
  CHECK(back[1].second.busy_s == 1.5);
  // Not four whole numbers, a negative, step 0, an overlong number: skipped, the good item kept.
  const auto mixed = decode_timings("1:2:3,x:1:1:1,-1:5:1:1,1:0:1:1,1:1:1:99999999999999999999,2:9:100:50,,:");
  REQUIRE(mixed.size() == 1);
  CHECK(mixed[0].first == 2);
  CHECK(mixed[0].second.wait_s == 50e-6);
  CHECK(decode_timings("").empty());
}

TEST_CASE("stragglers on the board: heartbeats' timings, the other nodes', and /metrics", "[stragglers][metrics]") {
  ProgressBoard board(0, 3, StragglerOptions{1.5, 4});  // 4: means of exact binary fractions
  CHECK(board.watches_stragglers());
  board.begin_attempt(0, {{0, 0, 100}, {1, 1, 101}});
  const auto t0 = SteadyClock::now();
  const auto heartbeat = [&](int rank, std::int64_t step, double step_time, double wait) {
    ddp::AgentMessage m;
    m.flags = ddp::AgentMessage::kHasStep;
    m.rank = rank;
    m.pid = 100 + rank;
    m.step = step;
    m.step_time_s = step_time;
    m.wait_time_s = wait;
    m.timestamp_s = 1.7e9;
    return board.record({m, SenderCredentials{m.pid, ::geteuid()}}, t0);
  };
  // Local ranks 0 and 1 are busy 0.125 s of their 0.375 s steps; rank 2 (another node) 0.375 s.
  for (std::int64_t step = 1; step <= 5; ++step) {
    REQUIRE(heartbeat(0, step, step == 1 ? 0 : 0.375, 0.25) == AgentVerdict::kRecorded);
    REQUIRE(heartbeat(1, step, step == 1 ? 0 : 0.375, 0.25) == AgentVerdict::kRecorded);
  }
  // A heartbeat with a wait that cannot be is dropped whole.
  CHECK(heartbeat(0, 6, 0.375, -1) == AgentVerdict::kInvalidValues);
  const auto local = board.take_local_timings();
  REQUIRE(local.size() == 8);  // steps 1..4 of two ranks: each heartbeat carries the previous step
  CHECK(local.front().second.step == 1);
  CHECK(local.front().second.busy_s == 0.125);
  CHECK(board.take_local_timings().empty());
  const auto even = board.straggler_standings();
  REQUIRE(even.size() == 2);
  CHECK_FALSE(even[0].straggler);
  CHECK_FALSE(even[1].straggler);
  std::vector<std::pair<int, StepTiming>> remote;
  for (std::int64_t step = 1; step <= 4; ++step) remote.push_back({2, {step, 0.375, 0.0}});
  remote.push_back({0, {4, 9.0, 0.0}});  // a local rank's timing from elsewhere is not taken
  board.add_remote_timings(remote);
  const auto all = board.straggler_standings();
  REQUIRE(all.size() == 3);
  CHECK(standing_of(all, 2)->straggler);
  CHECK(standing_of(all, 2)->ratio == 3.0);
  CHECK(standing_of(all, 2)->last_share == 1.0);
  CHECK_FALSE(standing_of(all, 0)->straggler);
  const std::string text = render_prometheus(board.snapshot(), {});
  INFO(text);
  CHECK_THAT(text, Contains("ddp_straggler_step_ratio{rank=\"2\",node_rank=\"0\"} 3\n"));
  CHECK_THAT(text, Contains("ddp_straggler_last_arrival_ratio{rank=\"2\",node_rank=\"0\"} 1\n"));
  CHECK_THAT(text, Contains("ddp_straggler{rank=\"2\",node_rank=\"0\"} 1\n"));
  CHECK_THAT(text, Contains("ddp_straggler{rank=\"0\",node_rank=\"0\"} 0\n"));
  // A live job keys another node's rank apart from its rank (rank 0 of host2 here, which repeats a
  // local rank): /metrics says its rank and host (See Note [Stragglers in a live job]).
  const int key = 1 << 20;
  std::vector<std::pair<int, StepTiming>> live;
  for (std::int64_t step = 1; step <= 4; ++step) live.push_back({key, {step, 0.375, 0.0}});
  board.add_remote_timings(live);
  board.label_remote_rank(key, 0, "host2");
  const std::string labelled = render_prometheus(board.snapshot(), {});
  INFO(labelled);
  CHECK_THAT(labelled, Contains("ddp_straggler{rank=\"0\",host=\"host2\",node_rank=\"0\"} 1\n"));
  CHECK_THAT(labelled, Contains("ddp_straggler{rank=\"0\",node_rank=\"0\"} 0\n"));  // the local rank 0
  // A new attempt starts the standings over; without --straggler_action there are none.
  board.begin_attempt(1, {{0, 0, 200}, {1, 1, 201}});
  CHECK(board.straggler_standings().empty());
  ProgressBoard plain(0, 2);
  CHECK_FALSE(plain.watches_stragglers());
  CHECK(render_prometheus(plain.snapshot(), {}).find("ddp_straggler") == std::string::npos);
}
