// Live recovery (ddp/elastic/fault_tolerant.h, ddp/elastic/membership.h) with in-process ranks: one thread per rank
// over one c10d::HashStore. A "lost" rank is a thread that marks itself gone (what a launcher's
// agent reports), aborts and destroys its group (Gloo closes its pairs) and leaves. The survivors'
// parameters are compared with a reference the test computes itself: plain SGD with momentum on
// the average of the ranks' gradients, with the same world size at every step.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/algorithms/diloco.h"
#include "ddp/algorithms/model_averaging.h"
#include "ddp/amp/grad_scaler.h"
#include "ddp/base/agent_message.h"
#include "ddp/base/str.h"
#include "ddp/base/error.h"
#include "ddp/elastic/fault_tolerant.h"
#include "ddp/elastic/membership.h"
#include "ddp/elastic/detail/membership_keys.h"
#include "ddp/algorithms/powersgd.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "samplers/distributed_sampler.h"
#include "tests/ddp/in_process_group.h"

namespace {

using namespace std::chrono_literals;

constexpr double kLr = 0.05;
constexpr double kMomentum = 0.9;
constexpr std::int64_t kSamplerBatch = 3;
constexpr std::int64_t kDatasetSize = 1000;

// The head is registered before the stem it follows, so the gradients become ready in another order
// than the initial buckets hold them: the survivors' rebuilt bucket layout differs from a joiner's
// initial one until reset_process_group hands rank 0's layout to everybody.
struct Net : torch::nn::Module {
  Net() {
    head = register_module("head", torch::nn::Linear(5, 3));
    stem = register_module("stem", torch::nn::Linear(6, 5));
    to(torch::kDouble);
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::tanh(stem(x))); }
  torch::nn::Linear head{nullptr}, stem{nullptr};
};

std::shared_ptr<Net> make_model() { return std::make_shared<Net>(); }

// The batch of `rank` of a group of `world` at `step`: a function of the three, so that the
// reference can recompute it.
std::pair<torch::Tensor, torch::Tensor> batch(std::int64_t step, int rank, int world) {
  auto generator = at::detail::createCPUGenerator(static_cast<std::uint64_t>(step * 1000 + rank * 17 + world));
  auto options = torch::TensorOptions().dtype(torch::kDouble);
  return {at::randn({4, 6}, generator, options), at::randn({4, 3}, generator, options)};
}

torch::Tensor flat(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(parts);
}

// Reference: the same model from `initial`, each step the average gradient of world_at[step] ranks.
torch::Tensor reference(const torch::Tensor& initial, const std::vector<int>& world_at) {
  auto model = make_model();
  {
    torch::NoGradGuard no_grad;
    std::int64_t offset = 0;
    for (auto& p : model->parameters()) {
      p.copy_(initial.slice(0, offset, offset + p.numel()).view_as(p));
      offset += p.numel();
    }
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLr).momentum(kMomentum));
  for (std::size_t step = 0; step < world_at.size(); ++step) {
    const int world = world_at[step];
    std::vector<torch::Tensor> sums;
    for (auto& p : model->parameters()) sums.push_back(torch::zeros_like(p));
    for (int r = 0; r < world; ++r) {
      optimizer.zero_grad();
      auto [x, y] = batch(static_cast<std::int64_t>(step), r, world);
      torch::mse_loss(model->forward(x), y).backward();
      auto params = model->parameters();
      for (std::size_t i = 0; i < params.size(); ++i) sums[i] += params[i].grad();
    }
    auto params = model->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = sums[i] / world;
    optimizer.step();
  }
  return flat(*model);
}

struct LeaveNow {};  // thrown by a test callback: this rank leaves during recovery

// What one rank does and saw.
struct Plan {
  std::optional<std::int64_t> leave_at_step;  // leaves before this step
  // Goes silent before this step (a partition: its connections stay open) until the others are done.
  std::optional<std::int64_t> hang_at_step;
  bool leave_during_first_recovery = false;   // leaves once its first recovery's group is built
  // A rank that leaves or hangs is marked gone (mark_left: what its launcher says); false: nobody
  // reports it (a partition that the launchers have not noticed yet).
  bool marked_gone = true;
  std::optional<std::chrono::milliseconds> group_timeout;  // this rank's, instead of Scenario::group_timeout
  bool joiner = false;  // starts as a joiner (See Scenario::hold_for_joiner_at)
};
struct Outcome {
  bool left = false;
  bool spare = false;
  bool released = false;  // a spare that the job did not claim (start() returned false)
  std::string error;
  torch::Tensor initial;  // rank 0 after start()
  torch::Tensor final_params;
  std::int64_t steps = 0;
  int regroups = 0;
  std::vector<int> world_at;  // the world size each applied step ran at
  std::int64_t hook_iterations = -1;  // PowerSGD's iteration count at the end
  double scale = 0;                   // the GradScaler's scale at the end
  std::int64_t growth_tracker = -1;
  std::vector<std::int64_t> samples;  // the sampler's indices of the applied steps (Scenario::sampler)
  std::string last_regroup_reason;
  ddp::FaultTolerant::Healing healing;  // what it last received
  torch::Tensor outer_state;  // DiLoCo's state after finish(), every tensor of it end to end
  std::int64_t outer_steps = -1;
};

struct Scenario {
  int initial_world = 4;
  std::int64_t total_steps = 5;
  int min_world_size = 1;
  std::map<int, Plan> plans;  // by thread (= initial rank; joiners after the initial ranks)
  int joiners = 0;
  // Hot spares (StoreMembershipOptions::spare), threads after the joiners; every member calls
  // finish() at the end, which releases the spares still waiting.
  int spares = 0;
  // The initial ranks wait before this step until a joiner has announced itself, so that it joins
  // after this step on every run.
  std::optional<std::int64_t> hold_for_joiner_at;
  bool powersgd = false;  // DDP with PowerSGD (compressing from its 2nd iteration)
  // A GradScaler whose scale grows every 2 steps (powers of two: the gradients stay exact).
  bool scaler = false;
  // Batches from a DistributedSampler (kSamplerBatch per rank, no shuffle) re-sharded at every new group
  // from the tracked count of samples the applied steps consumed.
  bool sampler = false;
  // DiLoCo (H = 2, Nesterov momentum) over a DDP whose hook does not communicate; finish() at the end.
  bool diloco = false;
  // Bound of every collective: the detection bound of a silent peer.
  std::chrono::milliseconds group_timeout = ddp::testing::kRankTimeout;
  std::chrono::milliseconds settle_timeout = 20s;  // every lost rank is marked gone, unless a Plan says not
  // FaultTolerantOptions::healing and heal_chunk_bytes (See Note [Healing at link speed]).
  ddp::FaultTolerantOptions::Healing healing = ddp::FaultTolerantOptions::Healing::kFromPeers;
  std::int64_t heal_chunk_bytes = std::int64_t{8} << 20;
  // FaultTolerantOptions::watch_interval (0: no watch).
  std::optional<std::chrono::milliseconds> watch_interval;
};

std::vector<Outcome> run(const Scenario& scenario) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(ddp::testing::kRankTimeout);
  const int threads_count = scenario.initial_world + scenario.joiners + scenario.spares;
  std::vector<Outcome> outcomes(static_cast<std::size_t>(threads_count));
  std::atomic<std::int64_t> rank0_steps{0};
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_count; ++t) {
    threads.emplace_back([&, t] {
      Outcome& out = outcomes[static_cast<std::size_t>(t)];
      const auto found = scenario.plans.find(t);
      const Plan plan = found != scenario.plans.end() ? found->second : Plan();
      try {
        if (plan.joiner) {
          const auto deadline = std::chrono::steady_clock::now() + 20s;
          // Announces itself only once rank 0 has applied the step before the hold, so that rank 0's
          // agreement of the held step is the first to see it.
          const std::int64_t announce_after = scenario.hold_for_joiner_at.value_or(1);
          while (rank0_steps.load() < announce_after && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(1ms);
          }
        }
        ddp::StoreMembershipOptions membership_options;
        membership_options.initial_size = scenario.initial_world;
        membership_options.initial_rank = t < scenario.initial_world ? t : -1;
        const bool spare = t >= scenario.initial_world + scenario.joiners;
        membership_options.joining = t >= scenario.initial_world && !spare;
        membership_options.spare = spare;
        out.spare = spare;
        membership_options.settle_timeout = scenario.settle_timeout;
        auto membership = std::make_shared<ddp::StoreMembership>(store, "thread-" + std::to_string(t),
                                                                 membership_options);
        ddp::FaultTolerantOptions options;
        options.min_world_size = scenario.min_world_size;
        options.membership_timeout = 20s;
        options.group.timeout = plan.group_timeout.value_or(scenario.group_timeout);
        if (scenario.watch_interval) options.watch_interval = *scenario.watch_interval;
        options.healing = scenario.healing;
        options.heal_chunk_bytes = scenario.heal_chunk_bytes;
        // See Scenario::sampler: the sampler follows each new group (FaultTolerantOptions::on_new_group).
        std::optional<ddp::samplers::DistributedSampler> sampler;
        std::int64_t consumed = 0;  // samples of the epoch the applied steps trained on, all ranks
        options.on_new_group = [&](ddp::ProcessGroup& group, const ddp::Membership&) {
          if (!scenario.sampler) return;
          ddp::samplers::DistributedSamplerOptions sampler_options(group.size(), group.rank());
          sampler_options.shuffle = false;
          sampler.emplace(kDatasetSize, sampler_options);
          sampler->set_state({/*epoch=*/0, /*position=*/consumed, /*num_replicas=*/1});
        };
        bool recovered_once = false;
        options.on_group_built = [&](ddp::ProcessGroup&, const ddp::Membership&) {
          if (plan.leave_during_first_recovery && recovered_once) throw LeaveNow();
          recovered_once = true;
        };
        ddp::FaultTolerant ft(store, membership, options);
        auto net = make_model();
        ddp::DistributedDataParallel model(net, ft.group());
        torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(kLr).momentum(kMomentum));
        std::shared_ptr<ddp::PowerSgdHook> powersgd;
        if (scenario.powersgd) {
          ddp::PowerSgdOptions hook_options;
          hook_options.start_powersgd_iter = 2;
          powersgd = std::make_shared<ddp::PowerSgdHook>(hook_options);
          model.register_comm_hook(powersgd);
        }
        ddp::amp::GradScalerOptions scaler_options;
        scaler_options.init_scale = 1024;
        scaler_options.growth_interval = 2;
        scaler_options.enabled = scenario.scaler;
        ddp::amp::GradScaler scaler(torch::kCPU, scaler_options);
        std::optional<ddp::DiLoCo> diloco;
        if (scenario.diloco) {
          model.register_comm_hook(std::make_shared<ddp::PostLocalSgdHook>(ddp::PostLocalSgdOptions{}));
          ddp::DiLoCoOptions diloco_options;
          diloco_options.sync_every = 2;
          diloco.emplace(ft.group(), optimizer, diloco_options);
          ft.track(*diloco);
        }
        ft.track(model);
        ft.track(optimizer);
        if (scenario.scaler) ft.track(scaler);
        if (scenario.sampler) ft.track("consumed", consumed);
        const auto leave = [&] {
          if (plan.marked_gone) membership->mark_left(ft.membership().round);
          ft.group()->abort();
          ft.group()->destroy();
          out.left = true;
        };
        if (!ft.start()) {
          out.released = true;
          return;
        }
        if (t == 0) out.initial = flat(*net);
        while (ft.steps() < scenario.total_steps) {
          if (plan.leave_at_step && ft.steps() == *plan.leave_at_step) {
            // The spares are in the pool before the loss, whatever the machine's speed: a spare still
            // starting comes into a later round instead (the world shrinks, then grows back).
            const auto deadline = std::chrono::steady_clock::now() + 20s;
            while (membership->spares_waiting() < scenario.spares && std::chrono::steady_clock::now() < deadline) {
              std::this_thread::sleep_for(1ms);
            }
            return leave();
          }
          if (plan.hang_at_step && ft.steps() == *plan.hang_at_step) {
            // The launcher knows a partitioned host is gone (unless the plan says not); its
            // connections stay open here.
            if (plan.marked_gone) membership->mark_left(ft.membership().round);
            const auto deadline = std::chrono::steady_clock::now() + 60s;
            while (finished.load() < scenario.initial_world - 1 && std::chrono::steady_clock::now() < deadline) {
              std::this_thread::sleep_for(1ms);
            }
            ft.group()->abort();
            ft.group()->destroy();
            out.left = true;
            return;
          }
          if (scenario.hold_for_joiner_at == ft.steps() && !plan.joiner) {
            const auto deadline = std::chrono::steady_clock::now() + 20s;
            while (!membership->change_pending(ft.membership().round) && std::chrono::steady_clock::now() < deadline) {
              std::this_thread::sleep_for(1ms);
            }
          }
          try {
            const int world = ft.group()->size();
            const int rank = ft.group()->rank();
            std::vector<std::size_t> indices;
            const bool applied = ft.step(
                [&] {
                  if (diloco) diloco->synchronize();  // See Note [DiLoCo under FaultTolerant]
                  optimizer.zero_grad();
                  auto [x, y] = batch(ft.steps(), rank, world);
                  if (sampler) {
                    indices = sampler->next(kSamplerBatch).value();
                    x = torch::stack({batch(static_cast<std::int64_t>(indices[0]), 0, 0).first[0],
                                      batch(static_cast<std::int64_t>(indices[1]), 0, 0).first[0],
                                      batch(static_cast<std::int64_t>(indices[2]), 0, 0).first[0]});
                    y = y.slice(0, 0, kSamplerBatch);
                  }
                  scaler.scale(torch::mse_loss(model(x), y)).backward();
                },
                [&] {
                  if (diloco) {
                    diloco->inner_step();
                  } else {
                    scaler.step(optimizer);
                  }
                  scaler.update();
                  consumed += world * kSamplerBatch;
                });
            if (applied) out.world_at.push_back(world);
            if (applied) out.samples.insert(out.samples.end(), indices.begin(), indices.end());
          } catch (const LeaveNow&) {
            return leave();
          }
          if (t == 0) rank0_steps.store(ft.steps());
        }
        if (diloco) {
          diloco->finish();
          std::vector<torch::Tensor> parts;
          for (const auto& item : diloco->state()) parts.push_back(item.value().to(torch::kDouble).reshape({-1}));
          out.outer_state = torch::cat(parts);
          out.outer_steps = diloco->outer_steps();
        }
        ft.finish();
        out.final_params = flat(*net);
        out.steps = ft.steps();
        out.regroups = ft.regroups();
        out.last_regroup_reason = ft.last_regroup_reason();
        out.healing = ft.last_healing();
        if (powersgd) out.hook_iterations = powersgd->iteration();
        out.scale = scaler.get_scale();
        out.growth_tracker = scaler.growth_tracker();
        ++finished;
      } catch (const std::exception& error) {
        out.error = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return outcomes;
}

// The survivors agree bit for bit, ran the expected world sizes and match the reference.
void check_survivors(const std::vector<Outcome>& outcomes, const std::vector<int>& expected_world_at) {
  const Outcome& first = outcomes[0];
  REQUIRE(first.error.empty());
  REQUIRE(first.initial.defined());
  const torch::Tensor expected = reference(first.initial, expected_world_at);
  for (std::size_t t = 0; t < outcomes.size(); ++t) {
    const Outcome& out = outcomes[t];
    INFO("thread " << t << ": " << out.error);
    if (out.left || out.released) continue;
    REQUIRE(out.error.empty());
    if (out.spare) {  // claimed: it applied the steps after its join
      REQUIRE(!out.world_at.empty());
      CHECK(out.world_at == std::vector<int>(expected_world_at.end() - static_cast<std::ptrdiff_t>(out.world_at.size()),
                                             expected_world_at.end()));
    } else {
      CHECK(out.world_at == expected_world_at);
    }
    CHECK(out.steps == static_cast<std::int64_t>(expected_world_at.size()));
    CHECK(torch::equal(out.final_params, first.final_params));
    CHECK(torch::allclose(out.final_params, expected, 1e-10, 1e-12));
  }
}

}  // namespace

namespace {

// Three ranks train; a joiner waits from the start. The members hold after step 2 until it waits,
// see it at step 3's agreement and regroup after step 3: it trains steps 4 on.
Scenario three_and_a_joiner(std::int64_t total_steps) {
  Scenario scenario;
  scenario.initial_world = 3;
  scenario.joiners = 1;
  scenario.total_steps = total_steps;
  scenario.plans[3].joiner = true;
  scenario.hold_for_joiner_at = 2;
  return scenario;
}

}  // namespace

TEST_CASE("a lost rank: the survivors drop the step and match the reference", "[live]") {
  Scenario scenario;
  scenario.total_steps = 5;
  scenario.plans[3].leave_at_step = 2;
  const auto outcomes = run(scenario);
  CHECK(outcomes[3].left);
  check_survivors(outcomes, {4, 4, 3, 3, 3});
  CHECK(outcomes[0].regroups == 2);  // start and one recovery
}

TEST_CASE("the sampler re-shards at the new world size: every sample of the applied steps once", "[live]") {
  Scenario scenario;
  scenario.total_steps = 5;
  scenario.plans[3].leave_at_step = 2;  // 2 steps x 4 ranks x 3 samples: 24, a multiple of 3 ranks
  scenario.sampler = true;
  const auto outcomes = run(scenario);
  std::vector<std::int64_t> seen;
  for (std::size_t t = 0; t < outcomes.size(); ++t) {
    INFO("thread " << t << ": " << outcomes[t].error);
    REQUIRE(outcomes[t].error.empty());
    if (!outcomes[t].left) CHECK(torch::equal(outcomes[t].final_params, outcomes[0].final_params));
    seen.insert(seen.end(), outcomes[t].samples.begin(), outcomes[t].samples.end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<std::int64_t> expected((4 * 2 + 3 * 3) * kSamplerBatch);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(seen == expected);  // none lost, none twice, the dropped step's samples trained after the regroup
}

// Note [Hot spares] in ddp/elastic/membership.h.
TEST_CASE("a hot spare takes a lost rank's place: the world size stays, no sample lost or trained twice", "[live][spares]") {
  Scenario scenario;
  scenario.total_steps = 5;
  scenario.spares = 2;
  scenario.plans[3].leave_at_step = 2;
  scenario.sampler = true;
  const auto outcomes = run(scenario);
  std::vector<std::int64_t> seen;
  int claimed = 0;
  for (std::size_t t = 0; t < outcomes.size(); ++t) {
    const Outcome& out = outcomes[t];
    INFO("thread " << t << ": " << out.error);
    REQUIRE(out.error.empty());
    seen.insert(seen.end(), out.samples.begin(), out.samples.end());
    if (t < 4) {
      CHECK(out.released == false);
      if (!out.left) CHECK(out.world_at == std::vector<int>{4, 4, 4, 4, 4});
      continue;
    }
    if (out.released) continue;
    ++claimed;  // the spare that took the pool's first index
    CHECK(out.world_at == std::vector<int>{4, 4, 4});  // steps 3 to 5
    CHECK(out.regroups == 1);
    CHECK(torch::equal(out.final_params, outcomes[0].final_params));
  }
  CHECK(claimed == 1);  // the other spare waited to the end, then left (released)
  CHECK(outcomes[4].released != outcomes[5].released);
  CHECK(outcomes[0].regroups == 2);
  std::sort(seen.begin(), seen.end());
  std::vector<std::int64_t> expected(4 * 5 * kSamplerBatch);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(seen == expected);  // the dropped step's samples trained once, after the spare came in
}

TEST_CASE("with a hot spare the survivors match the reference of an unchanged world", "[live][spares]") {
  Scenario scenario;
  scenario.total_steps = 5;
  scenario.spares = 1;
  scenario.plans[1].leave_at_step = 3;
  const auto outcomes = run(scenario);
  CHECK(outcomes[1].left);
  check_survivors(outcomes, {4, 4, 4, 4, 4});  // the spare too, from its join: See check_survivors
}

TEST_CASE("a dead spare marked gone is never claimed: the next one is", "[live][spares]") {
  // The first spare's launcher marked it gone before the loss (it died in the pool): the closer skips it.
  auto store = c10::make_intrusive<c10d::HashStore>();
  ddp::StoreMembershipOptions options;
  options.spare = true;
  options.settle_timeout = 20s;
  std::thread dead([&] {
    ddp::StoreMembership first(store, "node1/local2/attempt0", options);
    auto released = first.next(0, 20s);
    CHECK(released.released);  // its process is "dead": it only sees the job's end
  });
  ddp::StoreMembership pool(store, "observer");
  while (pool.spares_waiting() < 1) std::this_thread::sleep_for(1ms);
  CHECK(ddp::detail::membership_keys::mark_spares_gone(*store, "node1") == 1);
  CHECK(ddp::detail::membership_keys::mark_spares_gone(*store, "node1") == 0);  // once
  std::optional<ddp::Membership> spare_round;
  std::thread second([&] { spare_round = ddp::StoreMembership(store, "node0/local2/attempt0", options).next(0, 20s); });
  CHECK(pool.spares_waiting() == 0);  // the dead one does not count
  while (pool.spares_waiting() < 1) std::this_thread::sleep_for(1ms);
  // Round 1 of 2 members: member 1 is marked gone, member 0 closes it and fills it back to 2.
  ddp::StoreMembershipOptions member_options;
  member_options.initial_size = 2;
  member_options.initial_rank = 0;
  member_options.settle_timeout = 20s;
  ddp::StoreMembership member(store, "node0/local0/attempt0", member_options);
  member.mark_left(0);
  const ddp::Membership round = member.next(0, 20s);
  second.join();
  member.release_spares(5s);
  dead.join();
  CHECK(round.world_size == 2);
  CHECK(round.rank == 0);
  CHECK(round.joiners == std::vector<int>{1});
  CHECK_THAT(round.closed_by, Catch::Contains("1 spare(s) took the place"));
  REQUIRE(spare_round);
  CHECK_FALSE(spare_round->released);
  CHECK(spare_round->round == 1);
  CHECK(spare_round->rank == 1);
  CHECK(spare_round->world_size == 2);
  CHECK(pool.spares_waiting() == 0);
}

namespace {
// A HashStore that holds the first add() to a key (not a read: an add of 0), after it is applied,
// until the test lets it go: the process that called it stands for one killed right there.
class HeldAddStore : public c10d::HashStore {
 public:
  explicit HeldAddStore(std::string key) : held_key_(std::move(key)) {}
  std::int64_t add(const std::string& key, std::int64_t value) override {
    const std::int64_t result = c10d::HashStore::add(key, value);
    if (key == held_key_ && value != 0) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (held_) return result;
      held_ = true;
      changed_.notify_all();
      changed_.wait_for(lock, 20s, [this] { return released_; });
    }
    return result;
  }
  bool wait_until_held() {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, 20s, [this] { return held_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  std::string held_key_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool held_ = false;
  bool released_ = false;
};
}  // namespace

// Note [Taking a slot] in ddp/elastic/membership.cpp.
TEST_CASE("a member stopped between its arrival's writes leaves no slot unwritten: the round does not stall",
          "[live]") {
  // Member 1 is held inside its arrival's add to the round's count. Before the fix the count came
  // first and the arrival after it: member 0 closed the round with a slot nobody had written and
  // blocked in its read until the store's timeout.
  auto store = c10::make_intrusive<HeldAddStore>("ddp/membership/1/count");
  store->setTimeout(3s);
  const auto options = [](int rank) {
    ddp::StoreMembershipOptions o;
    o.initial_size = 2;
    o.initial_rank = rank;
    o.settle_timeout = 200ms;
    return o;
  };
  std::optional<ddp::Membership> held_round;
  std::thread held([&] { held_round = ddp::StoreMembership(store, "node1/local0/attempt0", options(1)).next(0, 20s); });
  REQUIRE(store->wait_until_held());
  const std::int64_t count = store->add("ddp/membership/1/count", 0);
  for (std::int64_t slot = 0; slot < count; ++slot) {
    INFO("slot " << slot << " of " << count);
    CHECK(store->check({"ddp/membership/1/slot/" + std::to_string(slot)}));
  }
  std::optional<ddp::Membership> round;
  CHECK_NOTHROW(round = ddp::StoreMembership(store, "node0/local0/attempt0", options(0)).next(0, 20s));
  store->release();
  held.join();
  REQUIRE(round);
  CHECK(round->world_size == 2);  // closed after the settle timeout, with the held member's arrival
  CHECK(round->rank == 0);
  REQUIRE(held_round);
  CHECK(held_round->rank == 1);
}

TEST_CASE("a spare that registers while a round closes is claimed, not passed over", "[live][spares]") {
  // The spare is held inside its registration's add to the pool's count; the round closes meanwhile.
  // Before the fix the count came first and the id after it: the closer found an index with no id,
  // passed over it for good, and the spare waited unclaimed to the job's end.
  auto store = c10::make_intrusive<HeldAddStore>(ddp::detail::membership_keys::spare_key("count"));
  ddp::StoreMembershipOptions options;
  options.spare = true;
  std::optional<ddp::Membership> spare_round;
  std::thread spare([&] { spare_round = ddp::StoreMembership(store, "node0/local2/attempt0", options).next(0, 20s); });
  REQUIRE(store->wait_until_held());
  ddp::StoreMembershipOptions member_options;
  member_options.initial_size = 2;
  member_options.initial_rank = 0;
  member_options.settle_timeout = 20s;
  ddp::StoreMembership member(store, "node0/local0/attempt0", member_options);
  CHECK(member.spares_waiting() == 1);
  member.mark_left(0);
  const ddp::Membership round = member.next(0, 20s);
  store->release();
  member.release_spares(5s);
  spare.join();
  CHECK(round.world_size == 2);
  CHECK(round.joiners == std::vector<int>{1});
  REQUIRE(spare_round);
  CHECK_FALSE(spare_round->released);
  CHECK(spare_round->round == 1);
  CHECK(spare_round->rank == 1);
}

TEST_CASE("two failures in a row", "[live]") {
  Scenario scenario;
  scenario.total_steps = 5;
  scenario.plans[3].leave_at_step = 1;
  scenario.plans[1].leave_at_step = 2;
  const auto outcomes = run(scenario);
  check_survivors(outcomes, {4, 3, 2, 2, 2});
  CHECK(outcomes[0].regroups == 3);
}

TEST_CASE("a silent peer (a partition): detected by the group's timeout, then the same as a loss", "[live]") {
  Scenario scenario;
  scenario.initial_world = 3;
  scenario.total_steps = 3;
  scenario.plans[2].hang_at_step = 1;
  scenario.group_timeout = 3s;
  scenario.watch_interval = 0ms;  // the timeout's path (the watch would see the mark first)
  const auto outcomes = run(scenario);
  CHECK(outcomes[2].left);
  check_survivors(outcomes, {3, 2, 2});
}

// The watch (See Note [Watching the round] in ddp/elastic/fault_tolerant.cpp). A silent peer that its
// launcher marked gone: the survivors' watch aborts the collective they wait in, long before the
// group's timeout (60 s); their recovery says so.
TEST_CASE("a silent peer marked gone: the watch ends the survivors' wait, not the group's timeout", "[live]") {
  Scenario scenario;
  scenario.initial_world = 3;
  scenario.total_steps = 3;
  scenario.plans[2].hang_at_step = 1;
  scenario.group_timeout = 60s;
  const auto outcomes = run(scenario);
  CHECK(outcomes[2].left);
  check_survivors(outcomes, {3, 2, 2});
  for (int t : {0, 1}) {
    INFO("thread " << t);
    CHECK_THAT(outcomes[static_cast<std::size_t>(t)].last_regroup_reason,
               Catch::Contains("the process group was aborted: 1 member(s) of round 1 marked gone (the membership watch)"));
  }
}

// What hosts.live_recovery met once under load (Note [Watching the round]): one survivor regrouped (here: its timeout is
// short), another still waits in the round's collective (its timeout is long) and nobody marked the
// silent peer gone, so the next round closes after the settle timeout with whoever arrived. The
// watch sees a member arrive in the next round and aborts the waiting rank's group, which arrives in
// time: both go on at world size 2. Without the watch rank 0 misses round 2 and thread 1 trains alone
// (world size 1) until rank 0 joins (the world sizes differ from {3, 2, 2, 2}).
TEST_CASE("a member that went on to the next round: the watch ends the others' wait", "[live]") {
  Scenario scenario;
  scenario.initial_world = 3;
  scenario.total_steps = 4;
  scenario.settle_timeout = 4s;
  scenario.group_timeout = 60s;
  scenario.plans[2].hang_at_step = 1;
  scenario.plans[2].marked_gone = false;
  scenario.plans[1].group_timeout = 1s;
  const auto outcomes = run(scenario);
  CHECK(outcomes[2].left);
  check_survivors(outcomes, {3, 2, 2, 2});
  CHECK_THAT(outcomes[0].last_regroup_reason,
             Catch::Contains("1 member(s) of round 1 went on to round 2 (the membership watch)"));
  CHECK_THAT(outcomes[1].last_regroup_reason, Catch::Contains("timed out"));
}

TEST_CASE("a failure during recovery: recovery retries with the next round", "[live]") {
  Scenario scenario;
  scenario.total_steps = 4;
  scenario.plans[3].leave_at_step = 1;
  scenario.plans[2].leave_during_first_recovery = true;
  const auto outcomes = run(scenario);
  CHECK(outcomes[2].left);
  check_survivors(outcomes, {4, 2, 2, 2});
}

TEST_CASE("a failure during recovery below the minimum size ends with a clear error", "[live]") {
  Scenario scenario;
  scenario.total_steps = 4;
  scenario.min_world_size = 3;
  scenario.plans[3].leave_at_step = 1;
  scenario.plans[2].leave_during_first_recovery = true;
  const auto outcomes = run(scenario);
  for (int t : {0, 1}) {
    INFO("thread " << t);
    CHECK_THAT(outcomes[static_cast<std::size_t>(t)].error,
               Catch::Contains("below the minimum of 3"));
  }
}

TEST_CASE("a joiner receives the state and trains on, bit for bit equal", "[live]") {
  Scenario scenario = three_and_a_joiner(6);
  scenario.scaler = true;
  const auto outcomes = run(scenario);
  for (std::size_t t = 0; t < outcomes.size(); ++t) {
    INFO("thread " << t << ": " << outcomes[t].error);
    REQUIRE(outcomes[t].error.empty());
    CHECK(outcomes[t].steps == scenario.total_steps);
    CHECK(torch::equal(outcomes[t].final_params, outcomes[0].final_params));
    // The scaler's state came with the join: 6 steps, growth every 2, from 1024.
    CHECK(outcomes[t].scale == 1024.0 * 8);
    CHECK(outcomes[t].growth_tracker == 0);
  }
  // The joiner applied only the steps after its join; the others ran 3, then 4 ranks.
  const std::vector<int> expected{3, 3, 3, 4, 4, 4};
  CHECK(outcomes[0].world_at == expected);
  CHECK(outcomes[3].world_at == std::vector<int>{4, 4, 4});
  CHECK(outcomes[3].regroups == 1);
  CHECK(torch::allclose(outcomes[0].final_params, reference(outcomes[0].initial, expected), 1e-10, 1e-12));
}

// Note [Heartbeat steps in a live job] in ddp/parallel/detail/heartbeat_observer.cpp: the launcher
// knows each worker by the rank it started it with, and lines the ranks' steps up by number. This
// process reads the heartbeats itself (all ranks are its threads: one pid, one DDP_AGENT_RANK).
TEST_CASE("heartbeats under FaultTolerant claim the launcher's rank and count the training's steps, a joiner's too",
          "[live][heartbeat]") {
  const std::string path = ddp::str("/tmp/ddp-heartbeat-test-", ::getpid(), ".sock");
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
  ::unlink(path.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  std::atomic<bool> done{false};
  std::vector<ddp::AgentMessage> heard;
  std::thread reader([&] {  // drains as they come: a datagram socket queues only a few
    while (!done) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      unsigned char buffer[256];
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) continue;
      if (const auto m = ddp::decode_agent_message(buffer, static_cast<std::size_t>(n))) heard.push_back(*m);
    }
  });
  ::setenv("DDP_AGENT_SOCKET", path.c_str(), 1);
  ::setenv("DDP_AGENT_RANK", "7", 1);  // a spare's: not the group's rank, which changes
  Scenario scenario = three_and_a_joiner(6);
  const auto outcomes = run(scenario);
  ::unsetenv("DDP_AGENT_SOCKET");
  ::unsetenv("DDP_AGENT_RANK");
  std::this_thread::sleep_for(100ms);
  done = true;
  reader.join();
  ::close(fd);
  ::unlink(path.c_str());
  for (const auto& outcome : outcomes) REQUIRE(outcome.error.empty());
  REQUIRE(outcomes[3].world_at == std::vector<int>{4, 4, 4});
  // Every heartbeat says rank 7; "entering step S" for S = 1..6, by 3 ranks before the join and by 4
  // after it: the joiner says 4, 5, 6 (counting its own forwards it said 1, 2, 3).
  std::map<std::int64_t, int> ranks_at_step;
  for (const auto& m : heard) {
    CHECK(m.rank == 7);
    CHECK((m.flags & ddp::AgentMessage::kHasStep) != 0);
    ++ranks_at_step[m.step];
  }
  CHECK(ranks_at_step == std::map<std::int64_t, int>{{1, 3}, {2, 3}, {3, 3}, {4, 4}, {5, 4}, {6, 4}});
}

// Note [Healing at link speed] in ddp/elastic/fault_tolerant.cpp.
TEST_CASE("a joiner heals from every holder in chunks, or from one broadcast: the same state either way", "[live][heal]") {
  for (const auto healing : {ddp::FaultTolerantOptions::Healing::kFromPeers, ddp::FaultTolerantOptions::Healing::kBroadcast}) {
    Scenario scenario = three_and_a_joiner(5);
    scenario.healing = healing;
    scenario.heal_chunk_bytes = 100;  // the state is a few KB: dozens of chunks, from each holder in turn
    const auto outcomes = run(scenario);
    for (std::size_t t = 0; t < outcomes.size(); ++t) {
      INFO("thread " << t << ": " << outcomes[t].error);
      REQUIRE(outcomes[t].error.empty());
      CHECK(torch::equal(outcomes[t].final_params, outcomes[0].final_params));
    }
    const auto& joiner = outcomes[3].healing;
    CHECK(joiner.bytes > 1000);
    CHECK(joiner.senders == (healing == ddp::FaultTolerantOptions::Healing::kFromPeers ? 3 : 1));
    CHECK(joiner.transfer_s > 0);
    CHECK(joiner.total_s >= joiner.transfer_s);
    CHECK(outcomes[0].healing.bytes == 0);    // the source received nothing
    CHECK(outcomes[1].healing.senders == 1);  // at the start nobody holds state but rank 0's
    CHECK(outcomes[1].healing.bytes > 500);
  }
}

TEST_CASE("ProcessGroup::exchange: transfers slower than the abort poll complete, chunks land in place", "[live][heal]") {
  // c10d's Gloo send and receive works fail for good when one wait of them times out: a receive that
  // waits longer than ProcessGroup::kAbortPollInterval must still complete (Note [Healing at link speed]).
  const auto received = ddp::testing::run_ranks<std::vector<std::int64_t>>(3, [](ddp::ProcessGroup& group) {
    std::vector<ddp::ProcessGroup::Transfer> sends, receives;
    auto inbox = torch::zeros({6}, torch::kLong);
    if (group.rank() == 2) {
      receives.push_back({0, 0, inbox.slice(0, 0, 3)});
      receives.push_back({1, 1, inbox.slice(0, 3, 6)});
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(400 * (group.rank() + 1)));
      const std::int64_t base = group.rank() == 0 ? 10 : 40;
      sends.push_back({2, group.rank(), torch::tensor({base, base + 1, base + 2}, torch::kLong)});
    }
    group.exchange(sends, receives, "test transfer");
    return std::vector<std::int64_t>(inbox.data_ptr<std::int64_t>(), inbox.data_ptr<std::int64_t>() + 6);
  });
  CHECK(received[2] == std::vector<std::int64_t>{10, 11, 12, 40, 41, 42});
}

TEST_CASE("a joiner with PowerSGD receives the hook's shared state", "[live]") {
  Scenario scenario;
  scenario.initial_world = 2;
  scenario.joiners = 1;
  scenario.total_steps = 5;
  scenario.plans[2].joiner = true;
  scenario.hold_for_joiner_at = 2;
  scenario.powersgd = true;
  const auto outcomes = run(scenario);
  for (std::size_t t = 0; t < outcomes.size(); ++t) {
    INFO("thread " << t << ": " << outcomes[t].error);
    REQUIRE(outcomes[t].error.empty());
    CHECK(torch::equal(outcomes[t].final_params, outcomes[0].final_params));
    CHECK(outcomes[t].hook_iterations == scenario.total_steps);  // the joiner's count came with the state
  }
  CHECK(outcomes[2].world_at == std::vector<int>{3, 3});
}

TEST_CASE("a joiner with DiLoCo receives the outer state: every rank ends bit for bit equal", "[live][diloco]") {
  Scenario scenario;
  scenario.initial_world = 2;
  scenario.joiners = 1;
  scenario.total_steps = 7;
  scenario.plans[2].joiner = true;
  scenario.hold_for_joiner_at = 3;  // joins with a momentum built by one outer step
  scenario.diloco = true;
  const auto outcomes = run(scenario);
  for (std::size_t t = 0; t < outcomes.size(); ++t) {
    INFO("thread " << t << ": " << outcomes[t].error);
    REQUIRE(outcomes[t].error.empty());
    CHECK(outcomes[t].outer_steps == 4);  // after steps 2, 4, 6, then finish()
    CHECK(torch::equal(outcomes[t].outer_state, outcomes[0].outer_state));
    CHECK(torch::equal(outcomes[t].final_params, outcomes[0].final_params));
  }
  CHECK(outcomes[2].regroups == 1);
  CHECK(outcomes[2].world_at.size() < outcomes[0].world_at.size());
}

TEST_CASE("a lost rank under DiLoCo: the survivors go on with the same outer state", "[live][diloco]") {
  Scenario scenario;
  scenario.initial_world = 3;
  scenario.total_steps = 6;
  scenario.plans[2].leave_at_step = 3;
  scenario.diloco = true;
  const auto outcomes = run(scenario);
  for (std::size_t t = 0; t < 2; ++t) {
    INFO("thread " << t << ": " << outcomes[t].error);
    REQUIRE(outcomes[t].error.empty());
    CHECK(outcomes[t].world_at == std::vector<int>{3, 3, 3, 2, 2, 2});
    CHECK(outcomes[t].outer_steps == 3);  // after steps 2, 4 and 6; finish() has nothing left
    CHECK(torch::equal(outcomes[t].outer_state, outcomes[0].outer_state));
    CHECK(torch::equal(outcomes[t].final_params, outcomes[0].final_params));
  }
  CHECK(outcomes[2].left);
}

TEST_CASE("a collective whose peer closed raises PeerLostError", "[live]") {
  const auto errors = ddp::testing::run_ranks<std::string>(2, [](ddp::ProcessGroup& group) -> std::string {
    group.barrier();
    if (group.rank() == 1) {
      group.destroy();  // Gloo closes this rank's pairs
      return "";
    }
    auto t = torch::ones({1000});
    try {
      for (int i = 0; i < 100; ++i) group.allreduce(t);
    } catch (const ddp::PeerLostError& error) {
      return std::string("PeerLostError: ") + error.what();
    } catch (const std::exception& error) {
      return std::string("other: ") + error.what();
    }
    return "no error";
  });
  CHECK_THAT(errors[0], Catch::StartsWith("PeerLostError: "));
}

TEST_CASE("abort() ends a wait blocked in a collective with PeerLostError", "[live]") {
  std::atomic<bool> done{false};
  const auto errors = ddp::testing::run_ranks<std::string>(2, [&](ddp::ProcessGroup& group) -> std::string {
    if (group.rank() == 1) {  // never joins the all-reduce; ends once rank 0 is done
      while (!done.load()) std::this_thread::sleep_for(1ms);
      return "";
    }
    std::thread aborter([&group] {
      std::this_thread::sleep_for(200ms);
      group.abort();
    });
    std::string result = "no error";
    auto t = torch::ones({4});
    try {
      group.allreduce(t);
    } catch (const ddp::PeerLostError& error) {
      result = std::string("PeerLostError: ") + error.what();
    } catch (const std::exception& error) {
      result = std::string("other: ") + error.what();
    }
    aborter.join();
    done.store(true);
    return result;
  });
  CHECK_THAT(errors[0], Catch::Contains("PeerLostError: ") &&
                            Catch::Contains("aborted"));
}

TEST_CASE("StoreMembership orders the previous members first and counts joiners", "[live]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ddp::StoreMembershipOptions options;
  options.initial_size = 2;
  std::vector<ddp::Membership> got(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ddp::StoreMembershipOptions mine = options;
      mine.initial_rank = 1 - r;  // reversed: thread 0 is rank 1
      ddp::StoreMembership membership(store, "m" + std::to_string(r), mine);
      got[static_cast<std::size_t>(r)] = membership.next(0, 10s);
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(got[0].rank == 1);
  CHECK(got[1].rank == 0);
  CHECK(got[0].world_size == 2);
  CHECK(got[0].round == 1);
  CHECK(got[0].joiners.empty());
  CHECK(got[0].store_prefix == got[1].store_prefix);
}

TEST_CASE("FaultTolerant refuses what it cannot recover", "[live]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto membership = std::make_shared<ddp::StoreMembership>(store, "alone");
  CHECK_THROWS_AS(ddp::FaultTolerant(nullptr, membership), ddp::InvalidArgument);
  CHECK_THROWS_AS(ddp::FaultTolerant(store, nullptr), ddp::InvalidArgument);
  ddp::FaultTolerant ft(store, membership);
  CHECK_THROWS_WITH(ft.step([] {}, [] {}), Catch::Contains("call start() first"));
  auto net = make_model();
  auto zero = ddp::ZeroRedundancyOptimizer::of<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1),
                                                                   ft.group());
  CHECK_THROWS_WITH(ft.track(*zero), Catch::Contains("ZeroRedundancyOptimizer is not supported"));
  CHECK_THROWS_AS(ddp::StoreMembership(store, ""), ddp::InvalidArgument);
}

TEST_CASE("StoreMembership: a joiner waits for the next round and comes after the members", "[live]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ddp::StoreMembershipOptions member_options;  // a job of one
  ddp::StoreMembership member(store, "z-member", member_options);
  const ddp::Membership first = member.next(0, 10s);
  CHECK(first.round == 1);
  CHECK(first.world_size == 1);
  CHECK_FALSE(member.change_pending(1));
  ddp::StoreMembershipOptions joiner_options;
  joiner_options.joining = true;
  ddp::Membership joined;
  std::thread joiner([&] { joined = ddp::StoreMembership(store, "a-joiner", joiner_options).next(0, 10s); });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!member.change_pending(1) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  const ddp::Membership second = member.next(first.round, 10s);
  joiner.join();
  CHECK(second.round == 2);
  CHECK(second.world_size == 2);
  CHECK(second.rank == 0);  // the member first, although the joiner's id sorts before it
  CHECK(joined.rank == 1);
  CHECK(joined.round == 2);
  CHECK(second.joiners == std::vector<int>{1});
  CHECK(joined.joiners == std::vector<int>{1});
  CHECK(second.store_prefix != first.store_prefix);
}
