// Checkpoints: round trip, "module." prefix, Python interoperability, corruption, atomicity.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/checkpoint/checkpoint.h"
#include "samplers/distributed_sampler.h"
#include "samplers/reshard.h"
#include "tests/ddp/test_checkpoint_support.h"

namespace fs = std::filesystem;

namespace {

using namespace ddp::testing::checkpoint;
using ddp::testing::TempDir;

const fs::path kPythonFixture = fs::path(DDP_TEST_DATA_DIR) / "python_ddp_state_dict.pt";

}  // namespace

TEST_CASE("a state dict survives save and load: dtypes, shapes, views, scalars", "[checkpoint]") {
  TempDir dir;
  ddp::StateDict state;
  state.insert("weight", torch::randn({3, 5}));
  state.insert("transposed", torch::randn({4, 2}).t());  // not contiguous
  state.insert("slice", torch::arange(10, torch::kDouble).slice(0, 1, 9, 3));  // offset, stride
  state.insert("half", torch::randn({7}).to(torch::kHalf));
  state.insert("count", torch::tensor(42, torch::kLong));
  state.insert("mask", torch::tensor({true, false, true}));
  state.insert("empty", torch::empty({0, 3}));
  const fs::path file = dir.path / "state.pt";
  ddp::save_state_dict(state, file);
  require_same_state(state, ddp::load_state_dict_file(file));
  require_same_state(state, ddp::load_state_dict_file(file, torch::Device(torch::kCPU)));
  // Nothing but the file itself is left behind.
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("state_dict() names parameters and buffers like PyTorch, without module.", "[checkpoint]") {
  Mlp model;
  const auto state = ddp::state_dict(model);
  const std::vector<std::string> expected = {"fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                                             "bn.running_mean", "bn.running_var",
                                             "bn.num_batches_tracked", "fc2.weight", "fc2.bias"};
  CHECK(state.keys() == expected);
  CHECK(ddp::strip_prefix(state, "fc1.").contains("weight"));
}

TEST_CASE("load_state_dict accepts module. keys and explains what does not fit", "[checkpoint]") {
  Mlp source;
  Mlp target;
  ddp::StateDict prefixed;
  for (const auto& item : ddp::state_dict(source)) prefixed.insert("module." + item.key(), item.value());
  ddp::load_state_dict(target, prefixed);
  require_same_state(ddp::state_dict(source), ddp::state_dict(target));

  ddp::StateDict partial = ddp::state_dict(source);
  partial.erase("fc2.bias");
  partial.insert("extra.weight", torch::zeros({1}));
  try {
    ddp::load_state_dict(target, partial);
    FAIL("a state dict with missing and unexpected keys was accepted");
  } catch (const ddp::InvalidArgument& e) {
    CHECK_THAT(e.what(), Catch::Contains("missing keys [fc2.bias]") &&
                             Catch::Contains("unexpected keys [extra.weight]"));
  }
  CHECK_NOTHROW(ddp::load_state_dict(target, partial, /*strict=*/false));

  ddp::StateDict wrong_shape = ddp::state_dict(source);
  wrong_shape["fc1.weight"] = torch::zeros({8, 5});
  CHECK_THROWS_WITH(ddp::load_state_dict(target, wrong_shape),
                    Catch::Contains("fc1.weight") && Catch::Contains("[8, 5]"));
}

TEST_CASE("a state dict saved by Python's DDP loads, prefix stripped", "[checkpoint][python]") {
  // tests/ddp/data/make_python_state_dict.py wrote this with torch.save(ddp_model.state_dict()).
  const auto state = ddp::load_state_dict_file(kPythonFixture);
  REQUIRE(state.keys() == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                                   "1.running_mean", "1.running_var",
                                                   "1.num_batches_tracked"});
  CHECK(torch::equal(state["0.weight"], torch::arange(6, torch::kFloat).reshape({2, 3}) * 0.5));
  CHECK(torch::equal(state["1.running_var"], torch::tensor({1.5f, 2.5f})));
  CHECK(state["1.num_batches_tracked"].dtype() == torch::kLong);
  CHECK(state["1.num_batches_tracked"].item<int64_t>() == 7);

  torch::nn::Sequential model(torch::nn::Linear(3, 2), torch::nn::BatchNorm1d(2));
  ddp::load_state_dict(*model, state);
  CHECK(torch::equal(model->named_parameters()["1.bias"], torch::tensor({0.5f, 0.25f})));
}

TEST_CASE("Python's torch.load reads the model file", "[checkpoint][python]") {
  TempDir dir;
  Mlp model;
  const auto state = ddp::state_dict(model);
  const fs::path file = dir.path / "model.pt";
  ddp::save_state_dict(state, file);
  const auto output = run_python(
      "import torch\n"
      "d = torch.load('" + file.string() + "')\n"  // weights_only=True, torch's default
      "assert type(d) is dict, type(d)\n"
      "for k, v in d.items():\n"
      "    print(k, str(v.dtype), 'x'.join(map(str, v.shape)) or '-', repr(v.double().sum().item()))\n",
      dir.path);
  if (!output) {
    WARN("skipped: no Python with torch (configure with -DDDP_PYTHON=/path/to/python)");
    return;
  }
  std::istringstream lines(*output);
  for (const auto& item : state) {
    std::string name, dtype, shape;
    double sum = 0;
    REQUIRE(lines >> name >> dtype >> shape >> sum);
    CHECK(name == item.key());
    CHECK(dtype == (item.value().dtype() == torch::kLong ? "torch.int64" : "torch.float32"));
    CHECK(shape == (item.value().dim() == 0 ? "-" : ddp::join(item.value().sizes(), "x")));
    CHECK(sum == Approx(item.value().to(torch::kDouble).sum().item<double>()).epsilon(1e-12));
  }
  std::string extra;
  CHECK_FALSE(lines >> extra);
}

TEST_CASE("truncated or corrupt state dict files give a clear IoError", "[checkpoint]") {
  TempDir dir;
  const fs::path file = dir.path / "model.pt";
  Mlp model;
  ddp::save_state_dict(ddp::state_dict(model), file);
  const auto bytes = read_bytes(file);
  for (size_t length : {size_t{0}, size_t{3}, size_t{21}, size_t{100}, bytes.size() / 2,
                        bytes.size() - 100, bytes.size() - 1}) {
    INFO("truncated to " << length << " of " << bytes.size() << " bytes");
    const fs::path cut = dir.path / "cut.pt";
    write_bytes(cut, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(length)));
    CHECK_THAT(io_error_of([&] { ddp::load_state_dict_file(cut); }), Catch::Contains(cut.string()));
  }
  // Flipped bytes: PyTorch's zip reader checks no CRCs, so some flips go unnoticed (the checkpoint
  // MANIFEST's checksums catch those); the point here is that none crashes or throws another type.
  const fs::path small_file = dir.path / "small.pt";
  ddp::StateDict small;
  small.insert("a", torch::arange(4, torch::kFloat));
  small.insert("b", torch::tensor(3, torch::kLong));
  ddp::save_state_dict(small, small_file);
  const auto small_bytes = read_bytes(small_file);
  int detected = 0;
  for (size_t position = 0; position < small_bytes.size(); position += 3) {
    auto corrupt = small_bytes;
    corrupt[position] = static_cast<char>(corrupt[position] ^ 0x41);
    write_bytes(small_file, corrupt);
    const std::string error = io_error_of([&] { ddp::load_state_dict_file(small_file); });
    if (error.find(small_file.string()) != std::string::npos) ++detected;
  }
  CHECK(detected > 0);
  CHECK_THROWS_WITH(ddp::load_state_dict_file(dir.path / "missing.pt"),
                    Catch::Contains("missing.pt") && Catch::Contains("No such file"));
  // A file that is no state dict at all.
  write_bytes(dir.path / "text.pt", std::vector<char>(100, 'x'));
  CHECK_THROWS_WITH(ddp::load_state_dict_file(dir.path / "text.pt"), Catch::Contains("not a PyTorch zip"));
}

TEST_CASE("checkpoint round trip: model, optimizer momentum, progress, RNG", "[checkpoint]") {
  TempDir dir;
  torch::manual_seed(1);
  Mlp model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train_steps(model, optimizer, 3, /*seed=*/10);

  ddp::samplers::DistributedSampler sampler(100, ddp::samplers::DistributedSamplerOptions(4, 0));
  sampler.set_epoch(2);
  ddp::TrainingProgress progress{2, 57, sampler.state(/*consumed=*/12)};
  int barriers = 0;
  torch::manual_seed(99);
  const fs::path saved =
      ddp::save_checkpoint(dir.path, model, &optimizer, progress, /*rank=*/0, [&] { ++barriers; });
  CHECK(barriers == 1);
  CHECK(saved == dir.path / "step-000000000057");
  ddp::StateDict saved_state;
  for (const auto& item : ddp::state_dict(model)) saved_state.insert(item.key(), item.value().clone());
  const auto random_after_save = torch::rand({5});

  torch::manual_seed(2);  // different initial weights and RNG position
  Mlp restored;
  torch::optim::SGD restored_optimizer(restored.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const auto loaded = ddp::load_checkpoint(saved, restored, &restored_optimizer);
  CHECK(torch::equal(torch::rand({5}), random_after_save));  // RNG state restored
  CHECK(loaded.epoch == 2);
  CHECK(loaded.step == 57);
  CHECK(loaded.sampler.epoch == 2);
  CHECK(loaded.sampler.position == 12);
  CHECK(loaded.sampler.num_replicas == 4);
  require_same_state(ddp::state_dict(model), ddp::state_dict(restored));

  // Momentum buffers came back: one more identical step keeps both models identical.
  train_steps(model, optimizer, 1, /*seed=*/20);
  train_steps(restored, restored_optimizer, 1, /*seed=*/20);
  require_same_state(ddp::state_dict(model), ddp::state_dict(restored));
  // Without the momentum state the same step would differ.
  Mlp fresh;
  ddp::load_checkpoint(saved, fresh, nullptr);
  torch::optim::SGD fresh_optimizer(fresh.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train_steps(fresh, fresh_optimizer, 1, /*seed=*/20);
  CHECK_FALSE(torch::equal(ddp::state_dict(fresh)["fc1.weight"], ddp::state_dict(model)["fc1.weight"]));

  SECTION("the sampler resumes from the saved position with another world size") {
    ddp::samplers::DistributedSampler two(100, ddp::samplers::DistributedSamplerOptions(2, 1));
    two.set_state(loaded.sampler);
    CHECK(two.epoch() == 2);
    // 12 per rank x 4 ranks = 48 samples done: the rest of the epoch, 52 samples, split among 2 ranks.
    CHECK(loaded.sampler.offset == 48);
    CHECK(two.position() == 0);
    CHECK(two.indices() == ddp::samplers::share_indices(100, two.options(), 2, 48));
    CHECK(two.state().offset == 48);
  }
  SECTION("a trainer.pt without the sampler's offset (older files) loads; the offset is position x ranks") {
    ddp::TrainingProgress old_progress{2, 58, ddp::samplers::SamplerState{2, 12, 4}};  // no offset: not written
    const fs::path old = ddp::save_checkpoint(dir.path / "old", model, &optimizer, old_progress, 0, [] {});
    const auto old_loaded = ddp::load_checkpoint(old, restored, &restored_optimizer);
    CHECK_FALSE(old_loaded.sampler.offset.has_value());
    ddp::samplers::DistributedSampler three(100, ddp::samplers::DistributedSamplerOptions(3, 0));
    three.set_state(old_loaded.sampler);
    CHECK(three.state().offset == 48);
  }
  SECTION("the model file in the folder is a plain state dict") {
    require_same_state(saved_state, ddp::load_state_dict_file(saved / "model.pt"));
  }
  SECTION("map_location and a process-group-like object") {
    struct FakeGroup {
      int rank() const { return 0; }
      int size() const { return 3; }
      void barrier() { ++count; }
      int count = 0;
    } group;
    const fs::path again = ddp::save_checkpoint(dir.path / "pg", model, &optimizer, progress, group);
    CHECK(group.count == 1);
    auto shared_group = std::make_shared<FakeGroup>();
    ddp::save_checkpoint(dir.path / "pg", model, &optimizer, progress, shared_group);
    CHECK(shared_group->count == 1);
    CHECK(ddp::list_checkpoints(dir.path / "pg").at(0).world_size == 3);
    Mlp other;
    ddp::CheckpointOptions on_cpu;
    on_cpu.map_location = torch::kCPU;
    CHECK_NOTHROW(ddp::load_checkpoint(again, other, nullptr, on_cpu));
  }
}

TEST_CASE("Adam's state survives a checkpoint", "[checkpoint]") {
  TempDir dir;
  torch::manual_seed(5);
  Mlp model;
  torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(0.01));
  train_steps(model, optimizer, 2, 30);
  const fs::path saved = ddp::save_checkpoint(dir.path, model, &optimizer, {1, 2, {}}, 0, nullptr);
  Mlp restored;
  torch::optim::Adam restored_optimizer(restored.parameters(), torch::optim::AdamOptions(0.01));
  ddp::load_checkpoint(saved, restored, &restored_optimizer);
  train_steps(model, optimizer, 2, 31);
  train_steps(restored, restored_optimizer, 2, 31);
  require_same_state(ddp::state_dict(model), ddp::state_dict(restored));
}

TEST_CASE("only rank 0 writes; every rank waits at the barrier, also when the write fails",
          "[checkpoint]") {
  TempDir dir;
  Mlp model;
  int barriers = 0;
  ddp::save_checkpoint(dir.path, model, nullptr, {0, 5, {}}, /*rank=*/1, [&] { ++barriers; });
  CHECK(barriers == 1);
  CHECK(ddp::list_checkpoints(dir.path).empty());

  const fs::path not_a_folder = dir.path / "file";
  write_bytes(not_a_folder, {'x'});
  CHECK_THROWS_AS(ddp::save_checkpoint(not_a_folder, model, nullptr, {0, 5, {}}, 0, [&] { ++barriers; }),
                  ddp::IoError);
  CHECK(barriers == 2);  // rank 0 still arrived, so no peer hangs

  Mlp restored;
  ddp::save_checkpoint(dir.path, model, nullptr, {0, 6, {}}, 0, nullptr);
  torch::optim::SGD optimizer(restored.parameters(), torch::optim::SGDOptions(0.1));
  CHECK_THROWS_WITH(ddp::load_checkpoint(dir.path / ddp::checkpoint_name(6), restored, &optimizer),
                    Catch::Contains("no optimizer state"));
}

TEST_CASE("corrupt or truncated checkpoint files are detected; the previous one is used",
          "[checkpoint]") {
  TempDir dir;
  Mlp model;
  torch::optim::Adam optimizer(model.parameters());
  train_steps(model, optimizer, 1, 3);
  for (int64_t step : {10, 20}) {
    ddp::save_checkpoint(dir.path, model, &optimizer, {0, step, {}}, 0, nullptr);
  }
  const fs::path newest = dir.path / ddp::checkpoint_name(20);
  REQUIRE(ddp::find_latest_valid_checkpoint(dir.path)->path == newest);

  for (const std::string name : {"model.pt", "trainer.pt"}) {
    const auto original = read_bytes(newest / name);
    SECTION(name + " truncated at several lengths") {
      for (size_t length : {size_t{0}, size_t{10}, original.size() / 3, original.size() - 1}) {
        INFO(name << " truncated to " << length);
        write_bytes(newest / name, std::vector<char>(original.begin(), original.begin() + static_cast<long>(length)));
        CHECK_THAT(io_error_of([&] { ddp::verify_checkpoint(newest); }),
                   Catch::Contains(name) && Catch::Contains("truncated"));
        Mlp target;
        CHECK_THROWS_AS(ddp::load_checkpoint(newest, target, nullptr), ddp::IoError);
        CHECK(ddp::find_latest_valid_checkpoint(dir.path)->step == 10);
      }
    }
    SECTION(name + " with flipped bytes") {
      for (size_t position = 0; position < original.size(); position += original.size() / 7 + 1) {
        INFO(name << " byte " << position << " flipped");
        auto corrupt = original;
        corrupt[position] = static_cast<char>(corrupt[position] ^ 0x20);
        write_bytes(newest / name, corrupt);
        CHECK_THAT(io_error_of([&] { ddp::verify_checkpoint(newest); }),
                   Catch::Contains(name) && Catch::Contains("corrupt"));
        CHECK(ddp::find_latest_valid_checkpoint(dir.path)->step == 10);
      }
    }
  }
  SECTION("a damaged MANIFEST") {
    write_bytes(newest / "MANIFEST", {'x', '\n'});
    CHECK_THROWS_WITH(ddp::verify_checkpoint(newest), Catch::Contains("MANIFEST"));
    CHECK(ddp::find_latest_valid_checkpoint(dir.path)->step == 10);
  }
}

TEST_CASE("writes are atomic: leftovers never count, an interrupted write keeps the old one",
          "[checkpoint]") {
  TempDir dir;
  const auto file = [](const std::string& name, const std::string& text) {
    return ddp::CheckpointFile{name, [text](const ddp::ByteSink& sink) { sink(text.data(), text.size()); }};
  };
  // verify_checkpoint() wants model.pt and trainer.pt listed; it does not parse them.
  const auto trainer = file("trainer.pt", "t");
  ddp::write_checkpoint_directory(dir.path, ddp::checkpoint_name(1), {file("model.pt", "first"), trainer},
                                  {{}, 0, 1, 1});
  // A writer that dies half-way through, for a new step and for the same step again.
  const ddp::CheckpointFile failing{"trainer.pt", [](const ddp::ByteSink& sink) {
                                      sink("partial", 7);
                                      throw std::runtime_error("disk full (simulated)");
                                    }};
  for (int64_t step : {2, 1}) {
    CHECK_THROWS_WITH(ddp::write_checkpoint_directory(dir.path, ddp::checkpoint_name(step),
                                                      {file("model.pt", "second"), failing}, {{}, 0, step, 1}),
                      "disk full (simulated)");
  }
  const auto checkpoints = ddp::list_checkpoints(dir.path);
  REQUIRE(checkpoints.size() == 1);
  CHECK(checkpoints[0].step == 1);
  CHECK(read_bytes(checkpoints[0].path / "model.pt") == (std::vector<char>{'f', 'i', 'r', 's', 't'}));
  CHECK_NOTHROW(ddp::verify_checkpoint(checkpoints[0].path));
  // Nothing temporary was left behind.
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);

  // What a killed writer leaves: a temporary folder, and a step folder without a MANIFEST.
  fs::create_directories(dir.path / ".tmp-step-000000000009-123-0");
  write_bytes(dir.path / ".tmp-step-000000000009-123-0" / "a.bin", {'x'});
  fs::create_directories(dir.path / ddp::checkpoint_name(8));
  CHECK(ddp::list_checkpoints(dir.path).size() == 1);
  CHECK(ddp::find_latest_valid_checkpoint(dir.path)->step == 1);

  // Saving the same step again replaces it.
  ddp::write_checkpoint_directory(dir.path, ddp::checkpoint_name(1), {file("model.pt", "again"), trainer},
                                  {{}, 0, 1, 1});
  CHECK(read_bytes(dir.path / ddp::checkpoint_name(1) / "model.pt").size() == 5);
  CHECK_NOTHROW(ddp::verify_checkpoint(dir.path / ddp::checkpoint_name(1)));
}

TEST_CASE("keep_last keeps the newest checkpoints and removes leftovers", "[checkpoint]") {
  TempDir dir;
  Mlp model;
  fs::create_directories(dir.path / ".tmp-step-000000000001-1-0");
  ddp::CheckpointOptions options;
  options.keep_last = 2;
  options.rng_state = false;
  for (int64_t step : {3, 1, 4, 2, 5}) {
    ddp::save_checkpoint(dir.path, model, nullptr, {0, step, {}}, 0, nullptr, options);
  }
  const auto kept = ddp::list_checkpoints(dir.path);
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].step == 5);
  CHECK(kept[1].step == 4);
  CHECK_FALSE(fs::exists(dir.path / ".tmp-step-000000000001-1-0"));
  CHECK(ddp::list_checkpoints(dir.path / "does-not-exist").empty());
  CHECK_FALSE(ddp::find_latest_valid_checkpoint(dir.path / "does-not-exist").has_value());
}
