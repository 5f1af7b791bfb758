// Worker of the multi-process checkpoint test (test_checkpoint_ranks.sh starts it through ddp_launch).
//   run     train a DDP model, save checkpoints mid-epoch at steps SAVE_AT and SAVE_AT + 2, check on
//           every rank that each is complete when save_checkpoint returns and that it loads back into
//           a fresh model, train on to STEPS; rank 0 writes the final state dict to DIR/final.pt
//   resume  load the newest valid checkpoint of DIR (model, optimizer, progress, sampler, RNG) and
//           train on to --steps: with the world size that saved it, the result equals final.pt
//   fail    saving into a path that is a file: rank 0 throws IoError, every other rank
//           CommunicationError quoting it (nobody hangs)
// Exits 0 when the behaviour holds, 1 with the reason on stderr when it does not.
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "ddp/checkpoint/checkpoint.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"
#include "samplers/distributed_sampler.h"

namespace fs = std::filesystem;

namespace {

constexpr int64_t kSamples = 40;
constexpr size_t kBatch = 4;

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(3, 6));
    fc2 = register_module("fc2", torch::nn::Linear(6, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE_IMPL(NetHolder, Net);

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect(bool condition, const std::string& what) {
  if (!condition) throw Failure(what);
}

bool same_parameters(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto left = ddp::state_dict(a);
  const auto right = ddp::state_dict(b);
  if (left.keys() != right.keys()) return false;
  for (const auto& item : left) {
    if (!torch::allclose(item.value(), right[item.key()], 1e-12, 1e-14)) return false;
  }
  return true;
}

struct Trainer {
  std::shared_ptr<ddp::ProcessGroup> group;
  NetHolder net;
  ddp::DistributedDataParallel<NetHolder> model;
  torch::optim::SGD optimizer;
  ddp::samplers::DistributedSampler sampler;
  torch::Tensor inputs;
  torch::Tensor targets;
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t consumed = 0;  // samples of this epoch this rank trained on

  explicit Trainer(std::shared_ptr<ddp::ProcessGroup> pg)
      : group(pg),
        net(make_net()),
        model(net, pg),
        optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)),
        sampler(kSamples, [&] { ddp::samplers::DistributedSamplerOptions o(pg->size(), pg->rank()); o.seed = 3; return o; }()) {
    torch::manual_seed(7);  // the same data on every rank
    inputs = torch::randn({kSamples, 3}, torch::kDouble);
    targets = inputs.sum(1, /*keepdim=*/true).sin();
  }

  static NetHolder make_net() {
    torch::manual_seed(1);
    NetHolder net;
    net->to(torch::kDouble);
    return net;
  }

  ddp::TrainingProgress progress() const { return {epoch, step, sampler.state(consumed)}; }

  void resume(const ddp::TrainingProgress& saved) {
    epoch = saved.epoch;
    step = saved.step;
    sampler.set_state(saved.sampler);
    consumed = sampler.position();
  }

  // Trains until `last_step`; calls on_step after each step.
  template <typename F>
  void train(int64_t last_step, F&& on_step) {
    sampler.set_epoch(epoch);
    while (step < last_step) {
      const auto batch = sampler.next(kBatch);
      if (!batch) {
        sampler.set_epoch(++epoch);
        consumed = 0;
        continue;
      }
      const auto index = torch::tensor(std::vector<int64_t>(batch->begin(), batch->end()));
      optimizer.zero_grad();
      const auto output = model.forward(inputs.index_select(0, index));
      torch::mse_loss(output, targets.index_select(0, index)).backward();
      optimizer.step();
      ++step;
      consumed += static_cast<int64_t>(batch->size());
      on_step();
    }
  }
};

void run(const std::shared_ptr<ddp::ProcessGroup>& group, const fs::path& dir, int64_t steps,
         int64_t save_at) {
  Trainer trainer(group);
  trainer.train(steps, [&] {
    if (trainer.step != save_at && trainer.step != save_at + 2) return;
    const fs::path saved = ddp::save_checkpoint(dir, *trainer.net, &trainer.optimizer, trainer.progress(), group);
    // save_checkpoint returned on this rank: rank 0 must have finished writing.
    const ddp::CheckpointInfo info = ddp::verify_checkpoint(saved);
    expect(info.step == trainer.step && info.world_size == group->size(),
           "the MANIFEST has the wrong step or world size");
    Net fresh;
    fresh.to(torch::kDouble);
    ddp::CheckpointOptions options;
    options.rng_state = false;
    ddp::load_checkpoint(saved, fresh, nullptr, options);
    expect(same_parameters(fresh, *trainer.net), "a fresh model loaded from the checkpoint differs");
  });
  if (group->rank() == 0) ddp::save_state_dict(ddp::state_dict(*trainer.net), dir / "final.pt");
  group->barrier();
}

void resume(const std::shared_ptr<ddp::ProcessGroup>& group, const fs::path& dir, int64_t steps,
            int64_t expected_step) {
  const auto latest = ddp::find_latest_valid_checkpoint(dir);
  expect(latest.has_value(), "no valid checkpoint in " + dir.string());
  expect(latest->step == expected_step, "resumed from step " + std::to_string(latest->step) +
                                            ", expected " + std::to_string(expected_step));
  Trainer trainer(group);
  const ddp::TrainingProgress saved = ddp::load_checkpoint(latest->path, *trainer.net, &trainer.optimizer);
  trainer.resume(saved);
  // Where the epoch goes on: the saved global offset (the same position at the same world size).
  expect(trainer.progress().sampler.offset == saved.sampler.offset, "the sampler did not resume at its offset");
  if (latest->world_size == group->size()) {
    expect(trainer.sampler.position() == saved.sampler.position, "the sampler did not resume at its position");
  }
  trainer.train(steps, [] {});
  if (latest->world_size == group->size()) {
    Net reference;
    reference.to(torch::kDouble);
    ddp::load_state_dict(reference, ddp::load_state_dict_file(dir / "final.pt"));
    expect(same_parameters(reference, *trainer.net),
           "training resumed from the checkpoint ended elsewhere than uninterrupted training");
  }
  group->barrier();
}

void fail(const std::shared_ptr<ddp::ProcessGroup>& group, const fs::path& dir) {
  const fs::path not_a_folder = dir / "not_a_folder";
  if (group->rank() == 0) {
    fs::create_directories(dir);
    std::ofstream(not_a_folder) << "x";
  }
  group->barrier();
  Net net;
  try {
    ddp::save_checkpoint(not_a_folder, net, nullptr, {0, 1, {}}, group);
  } catch (const ddp::CommunicationError& e) {
    expect(group->rank() != 0, "rank 0 threw CommunicationError instead of its IoError");
    expect(std::string(e.what()).find("not_a_folder") != std::string::npos,
           std::string("the error does not quote rank 0's: ") + e.what());
    return;
  } catch (const ddp::IoError& e) {
    expect(group->rank() == 0, "a rank other than 0 threw IoError");
    return;
  }
  throw Failure("saving into a file path did not fail");
}

int worker_main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: test_checkpoint_worker run|resume|fail DIR [STEPS [SAVE_AT|EXPECTED_STEP]]\n";
    return 2;
  }
  const std::string mode = argv[1];
  const fs::path dir = argv[2];
  const int64_t steps = argc > 3 ? std::stoll(argv[3]) : 16;
  const int64_t save_at = argc > 4 ? std::stoll(argv[4]) : 7;
  ddp::InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(30);
  auto group = ddp::init_process_group(init);
  try {
    if (mode == "run") {
      run(group, dir, steps, save_at);
    } else if (mode == "resume") {
      resume(group, dir, steps, save_at);
    } else if (mode == "fail") {
      fail(group, dir);
    } else {
      std::cerr << "unknown mode " << mode << "\n";
      return 2;
    }
  } catch (const Failure& failure) {
    std::cerr << "FAILED on rank " << group->rank() << ": " << failure.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ddp::run_main(argc, argv, worker_main); }
