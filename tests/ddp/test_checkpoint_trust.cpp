// Checkpoints that cannot run code or be planted: Python reads the whole checkpoint with
// weights_only=True, planted pickles and TorchScript files are refused without running anything,
// other users' folders are refused, a cut MANIFEST falls back to the older checkpoint, MANIFESTs
// of the previous format still load, and the checksums are xxhsum's.
#include <sys/stat.h>
#include <unistd.h>

#include <functional>
#include <memory>

#include "tests/ddp/test_checkpoint_support.h"

#include "ddp/checkpoint/detail/checkpoint_manifest.h"

namespace fs = std::filesystem;

namespace {

using namespace ddp::testing::checkpoint;
using ddp::testing::TempDir;

// A checkpoint of Mlp after a few steps of `optimizer`, under root; returns its folder.
fs::path save_trained(const fs::path& root, Mlp& model, torch::optim::Optimizer& optimizer, int64_t step) {
  train_steps(model, optimizer, 2, static_cast<int>(step));
  return ddp::save_checkpoint(root, model, &optimizer, {1, step, {3, 17, 2}}, 0, nullptr);
}

std::string read_text(const fs::path& path) {
  const auto bytes = read_bytes(path);
  return std::string(bytes.begin(), bytes.end());
}

// Rewrites a checkpoint folder with `trainer` (and `model`) bytes and a MANIFEST that matches them,
// as anyone who can write the folder could: the checksums do not stop a planted file.
void plant(const fs::path& root, int64_t step, const std::string& name, const std::vector<char>& bytes) {
  const fs::path folder = root / ddp::checkpoint_name(step);
  std::vector<ddp::CheckpointFile> files;
  for (const std::string file : {"model.pt", "trainer.pt"}) {
    const auto content = file == name ? bytes : read_bytes(folder / file);
    files.push_back({file, [content](const ddp::ByteSink& sink) { sink(content.data(), content.size()); }});
  }
  ddp::write_checkpoint_directory(root, ddp::checkpoint_name(step), files, {{}, 1, step, 1});
}

std::string run_command(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[256];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  ::pclose(pipe);
  return output;
}

}  // namespace

TEST_CASE("Python reads the whole checkpoint with weights_only=True, optimizer state included",
          "[checkpoint][python]") {
  if (!have_python()) {
    WARN("skipped: no Python with torch (configure with -DDDP_PYTHON=/path/to/python)");
    return;
  }
  TempDir dir;
  torch::manual_seed(3);
  Mlp model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  const fs::path folder = save_trained(dir.path / "sgd", model, sgd, 4);
  Mlp adam_model;
  torch::optim::Adam adam(adam_model.parameters(), torch::optim::AdamOptions(0.01).betas({0.8, 0.95}));
  const fs::path adam_folder = save_trained(dir.path / "adam", adam_model, adam, 6);
  const auto output = run_python(
      "import torch\n"
      "for folder in ['" + folder.string() + "', '" + adam_folder.string() + "']:\n"
      "    m = torch.load(folder + '/model.pt', weights_only=True)\n"
      "    t = torch.load(folder + '/trainer.pt', weights_only=True)\n"
      "    o = t['optimizer']\n"
      "    g = o['param_groups'][0]\n"
      "    print(len(m), t['epoch'], t['step'], t['sampler']['position'], len(o['state']), g['params'][-1])\n"
      "    for k in sorted(g):\n"
      "        if k != 'params': print(k, repr(g[k]))\n"
      "    s = o['state'][0]\n"
      "    for k in sorted(s):\n"
      "        v = s[k]\n"
      "        print(k, repr(v.double().sum().item()) if torch.is_tensor(v) else v)\n"
      "    print('rng', t['rng']['cpu'].dtype, len(t['rng']['cuda']))\n"
      // Python's optimizer of the same type takes the state, and steps with it.
      "    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))\n"
      "    opt = (torch.optim.SGD if 'momentum' in g else torch.optim.Adam)(net.parameters(), lr=1.0)\n"
      "    opt.load_state_dict(o)\n"
      "    net(torch.randn(6, 4)).pow(2).mean().backward()\n"
      "    opt.step()\n"
      "    print('python-loads', type(opt).__name__, opt.param_groups[0]['lr'])\n",
      dir.path);
  REQUIRE(output.has_value());
  const auto first = [](torch::optim::Optimizer& optimizer, const std::string& name) {
    const auto& parameter = optimizer.param_groups()[0].params()[0];
    auto& state = *optimizer.state().at(parameter.unsafeGetTensorImpl());
    torch::Tensor value;
    if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(&state)) value = s->momentum_buffer();
    if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
      value = name == "exp_avg" ? s->exp_avg() : s->exp_avg_sq();
    }
    return value.to(torch::kDouble).sum().item<double>();
  };
  const std::vector<std::string> lines = [&] {
    std::vector<std::string> result;
    std::istringstream in(*output);
    for (std::string line; std::getline(in, line);) result.push_back(line);
    return result;
  }();
  REQUIRE(lines.size() == 20);
  CHECK(lines[0] == "9 1 4 17 6 5");
  CHECK(lines[1] == "dampening 0.0");
  CHECK(lines[2] == "lr 0.1");
  CHECK(lines[3] == "momentum 0.9");
  CHECK(lines[4] == "nesterov True");
  CHECK(lines[5] == "weight_decay 0.0");
  const auto number_after = [](const std::string& line) { return std::stod(line.substr(line.find(' ') + 1)); };
  CHECK(lines[6].rfind("momentum_buffer ", 0) == 0);
  CHECK(number_after(lines[6]) == Approx(first(sgd, "momentum_buffer")).epsilon(1e-12));
  CHECK(lines[7].rfind("rng torch.uint8 ", 0) == 0);
  CHECK(lines[8] == "python-loads SGD 0.1");
  CHECK(lines[9] == "9 1 6 17 6 5");
  CHECK(lines[10] == "amsgrad False");
  CHECK(lines[11] == "betas (0.8, 0.95)");
  CHECK(lines[12] == "eps 1e-08");
  CHECK(lines[13] == "lr 0.01");
  CHECK(lines[14] == "weight_decay 0.0");
  CHECK(lines[15].rfind("exp_avg ", 0) == 0);
  CHECK(number_after(lines[15]) == Approx(first(adam, "exp_avg")).epsilon(1e-12));
  CHECK(lines[16].rfind("exp_avg_sq ", 0) == 0);
  CHECK(number_after(lines[16]) == Approx(first(adam, "exp_avg_sq")).epsilon(1e-12));
  CHECK(lines[17] == "step 2");
  CHECK(lines[18].rfind("rng torch.uint8 ", 0) == 0);
  CHECK(lines[19] == "python-loads Adam 0.01");
}

// Writes three files that run code when loaded the unsafe way, each proven live by Python (which
// loads it and sees the marker appear, then removes the marker): a pickle whose REDUCE calls
// builtins.open, a pickle of an object whose __setstate__ opens the marker, and a TorchScript module
// whose __setstate__ calls torch.from_file(marker, shared=True) (what issue 21's probe used).
const char* const kPlantScript = R"py(
import os, sys, importlib.util, torch
folder, marker = sys.argv[1], sys.argv[2]
class Reduce:
    def __reduce__(self):
        return (open, (marker, 'w'))
class SetState:
    def __init__(self):
        self.x = 1  # a state, so that unpickling calls __setstate__
    def __setstate__(self, state):
        open(marker, 'w').close()
def live(name, load):
    assert not os.path.exists(marker)
    load(os.path.join(folder, name))
    assert os.path.exists(marker), name
    os.remove(marker)
    print('live', name)
torch.save({'epoch': Reduce()}, os.path.join(folder, 'reduce.pt'))
live('reduce.pt', lambda p: torch.load(p, weights_only=False))
torch.save({'epoch': SetState()}, os.path.join(folder, 'setstate.pt'))
live('setstate.pt', lambda p: torch.load(p, weights_only=False))
source = os.path.join(folder, 'planted_module.py')
with open(source, 'w') as out:
    out.write("""import torch
from typing import Tuple
class Planted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = 1
    @torch.jit.export
    def __getstate__(self) -> Tuple[int, bool]:
        return (self.x, self.training)
    @torch.jit.export
    def __setstate__(self, state: Tuple[int, bool]) -> None:
        self.training = state[1]
        self.x = state[0] + torch.from_file(%r, shared=True, size=8, dtype=torch.uint8).numel()
""" % marker)
spec = importlib.util.spec_from_file_location('planted_module', source)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
torch.jit.script(module.Planted()).save(os.path.join(folder, 'torchscript.pt'))
live('torchscript.pt', torch.jit.load)
)py";

TEST_CASE("planted pickles and TorchScript files are refused, naming the file, and nothing runs",
          "[checkpoint][python]") {
  if (!have_python()) {
    WARN("skipped: no Python with torch (configure with -DDDP_PYTHON=/path/to/python)");
    return;
  }
  TempDir dir;
  const fs::path planted = dir.path / "planted";
  fs::create_directories(planted);
  const fs::path marker = dir.path / "marker";
  std::ofstream(dir.path / "plant.py") << kPlantScript;
  const std::string output = run_command(ddp::str(DDP_PYTHON, " ", (dir.path / "plant.py").string(), " ",
                                                  planted.string(), " ", marker.string(), " 2>&1"));
  INFO(output);
  // Line by line: Python's warnings (torch 2.14 deprecates torch.jit) come on stderr between them.
  for (const char* line : {"live reduce.pt\n", "live setstate.pt\n", "live torchscript.pt\n"})
    REQUIRE(output.find(line) != std::string::npos);

  Mlp model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const fs::path root = dir.path / "checkpoints";
  const fs::path folder = save_trained(root, model, optimizer, 1);
  const auto real_files = std::make_pair(read_bytes(folder / "model.pt"), read_bytes(folder / "trainer.pt"));
  for (const std::string payload : {"reduce.pt", "setstate.pt", "torchscript.pt"}) {
    for (const std::string target : {"trainer.pt", "model.pt"}) {
      INFO(payload << " as " << target);
      plant(root, 1, target, read_bytes(planted / payload));
      CHECK(ddp::find_latest_valid_checkpoint(root)->path == folder);  // the MANIFEST matches it
      Mlp restored;
      torch::optim::SGD restored_optimizer(restored.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      const std::string error = io_error_of([&] { ddp::load_checkpoint(folder, restored, &restored_optimizer); });
      CHECK_THAT(error, Catch::Contains((folder / target).string()) && Catch::Contains("Python object of type"));
      CHECK(error.find('\n') == std::string::npos);
      CHECK_FALSE(fs::exists(marker));
      plant(root, 1, target, target == "model.pt" ? real_files.first : real_files.second);
      CHECK_NOTHROW(ddp::load_checkpoint(folder, restored, &restored_optimizer));
    }
  }
}

TEST_CASE("checkpoint folders are private; another user's newer step folder is refused and kept",
          "[checkpoint]") {
  TempDir dir;
  Mlp model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1));
  const fs::path root = dir.path / "new-root";
  const fs::path older = save_trained(root, model, optimizer, 1);
  const auto mode_of = [](const fs::path& path) {
    struct stat info {};
    REQUIRE(::stat(path.c_str(), &info) == 0);
    return info.st_mode & 07777;
  };
  CHECK(mode_of(root) == 0700);
  CHECK(mode_of(older) == 0700);
  for (const std::string file : {"model.pt", "trainer.pt", "MANIFEST"}) CHECK(mode_of(older / file) == 0600);

  const fs::path newer = save_trained(root, model, optimizer, 2);
  if (::geteuid() != 0) {
    WARN("skipped the foreign-owner part: it needs root to chown a folder to nobody");
    return;
  }
  REQUIRE(::chown(newer.c_str(), 65534, 65534) == 0);  // nobody: as if another user planted it
  CHECK_THAT(io_error_of([&] { ddp::verify_checkpoint(newer); }),
             Catch::Contains(newer.string()) && Catch::Contains("owned by uid 65534"));
  CHECK(ddp::find_latest_valid_checkpoint(root)->path == older);
  const auto candidates = ddp::inspect_checkpoints(root);
  REQUIRE(candidates.size() == 2);
  CHECK_FALSE(candidates[0].valid);
  CHECK_THAT(candidates[0].problem, Catch::Contains("owned by uid 65534"));
  // Pruning neither counts nor removes it: keep_last 1 keeps this user's newest.
  ddp::prune_checkpoints(root, 1);
  CHECK(fs::exists(newer));
  CHECK(fs::exists(older));
  // A world-writable folder is refused too.
  REQUIRE(::chown(newer.c_str(), ::geteuid(), ::getegid()) == 0);
  fs::permissions(newer, fs::perms::others_write, fs::perm_options::add);
  CHECK_THAT(io_error_of([&] { ddp::verify_checkpoint(newer); }), Catch::Contains("writable by every user"));
}

TEST_CASE("a MANIFEST cut at any byte, or edited, is invalid and the older checkpoint is used",
          "[checkpoint]") {
  TempDir dir;
  Mlp model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1));
  const fs::path older = save_trained(dir.path, model, optimizer, 1);
  const fs::path newer = save_trained(dir.path, model, optimizer, 2);
  const std::string manifest = read_text(newer / "MANIFEST");
  REQUIRE(manifest.rfind("ddp-checkpoint 2\n", 0) == 0);
  for (size_t cut = 0; cut < manifest.size(); ++cut) {
    INFO("cut at byte " << cut << " of " << manifest.size());
    write_bytes(newer / "MANIFEST", std::vector<char>(manifest.begin(), manifest.begin() + static_cast<long>(cut)));
    CHECK_THROWS_AS(ddp::verify_checkpoint(newer), ddp::IoError);
    const auto latest = ddp::find_latest_valid_checkpoint(dir.path);
    REQUIRE(latest.has_value());
    CHECK(latest->path == older);
  }
  // Edits: another epoch, another file size, a line dropped from the middle, a line added.
  std::string edited = manifest;
  edited.replace(edited.find("epoch 1"), 7, "epoch 9");
  const std::string dropped = [&] {
    std::string text = manifest;
    const auto line = text.find("file model.pt");
    text.erase(line, text.find('\n', line) + 1 - line);
    return text;
  }();
  for (const std::string& text : {edited, dropped, manifest + "file extra 0 0000000000000000\n"}) {
    write_bytes(newer / "MANIFEST", std::vector<char>(text.begin(), text.end()));
    CHECK_THAT(io_error_of([&] { ddp::verify_checkpoint(newer); }), Catch::Contains("cut or edited"));
    CHECK(ddp::find_latest_valid_checkpoint(dir.path)->path == older);
  }
  write_bytes(newer / "MANIFEST", std::vector<char>(manifest.begin(), manifest.end()));
  CHECK(ddp::find_latest_valid_checkpoint(dir.path)->path == newer);
}

TEST_CASE("a checkpoint with a MANIFEST of the previous format (version 1) still loads", "[checkpoint]") {
  TempDir dir;
  torch::manual_seed(4);
  Mlp model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const fs::path folder = save_trained(dir.path, model, optimizer, 3);
  // What the previous code wrote: no end line, the legacy checksum (ddp/checkpoint/detail/checkpoint_manifest.h keeps
  // that code path for reading).
  std::vector<ddp::detail::ManifestFile> files;
  for (const std::string name : {"model.pt", "trainer.pt"}) {
    files.push_back({name, ddp::detail::digest_file(folder / name, ddp::detail::ChecksumKind::kLegacy)});
  }
  const std::string old_manifest = ddp::detail::format_manifest({folder, 1, 3, 1}, files, /*version=*/1);
  REQUIRE(old_manifest.find("end ") == std::string::npos);
  write_bytes(folder / "MANIFEST", std::vector<char>(old_manifest.begin(), old_manifest.end()));
  CHECK(ddp::verify_checkpoint(folder).step == 3);
  Mlp restored;
  torch::optim::SGD restored_optimizer(restored.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  CHECK(ddp::load_checkpoint(folder, restored, &restored_optimizer).step == 3);
  require_same_state(ddp::state_dict(model), ddp::state_dict(restored));
  // Its checksums still catch a corrupt file, and it still must list both files.
  auto bytes = read_bytes(folder / "model.pt");
  bytes[bytes.size() / 2] ^= 1;
  write_bytes(folder / "model.pt", bytes);
  CHECK_THAT(io_error_of([&] { ddp::verify_checkpoint(folder); }), Catch::Contains("checksum mismatch"));
  const std::string no_model = ddp::detail::format_manifest({folder, 1, 3, 1}, {files[1]}, 1);
  write_bytes(folder / "MANIFEST", std::vector<char>(no_model.begin(), no_model.end()));
  CHECK_THAT(io_error_of([&] { ddp::verify_checkpoint(folder); }), Catch::Contains("does not list model.pt"));
}

TEST_CASE("the MANIFEST's checksums are XXH3-64 as xxhsum -H3 prints them", "[checkpoint]") {
  if (run_command("command -v xxhsum").empty()) {
    WARN("skipped: xxhsum is not installed (Debian package xxhash)");
    return;
  }
  TempDir dir;
  Mlp model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1));
  const fs::path folder = save_trained(dir.path, model, optimizer, 1);
  const std::string manifest = read_text(folder / "MANIFEST");
  // xxhsum 0.8 prints "XXH3 (<file>) = <hex>" with -H3 (BSD style) or "<hex>  <file>": take the hex.
  const auto xxhsum = [](const std::string& command) {
    const std::string output = run_command(command);
    const auto equals = output.find('=');
    const auto digest = output.find_first_of("0123456789abcdef", equals == std::string::npos ? 0 : equals);
    return output.substr(digest, 16);
  };
  for (const std::string name : {"model.pt", "trainer.pt"}) {
    const auto line = manifest.find("file " + name + " ");
    REQUIRE(line != std::string::npos);
    const std::string entry = manifest.substr(line, manifest.find('\n', line) - line);
    CHECK(entry.substr(entry.size() - 16) == xxhsum("xxhsum -H3 " + (folder / name).string()));
  }
  const auto end = manifest.rfind("end ");
  CHECK(manifest.substr(manifest.size() - 17, 16) ==
        xxhsum("head -c " + std::to_string(end) + " " + (folder / "MANIFEST").string() + " | xxhsum -H3"));
}

TEST_CASE("every optimizer type checkpoints can store resumes exactly; others are refused", "[checkpoint]") {
  namespace optim = torch::optim;
  using Factory = std::function<std::unique_ptr<optim::Optimizer>(Mlp&)>;
  const std::vector<std::pair<std::string, Factory>> optimizers = {
      {"SGD",
       [](Mlp& m) {
         return std::make_unique<optim::SGD>(m.parameters(),
                                             optim::SGDOptions(0.1).momentum(0.8).dampening(0.1).weight_decay(0.01));
       }},
      {"Adam",
       [](Mlp& m) {
         return std::make_unique<optim::Adam>(m.parameters(),
                                              optim::AdamOptions(0.01).amsgrad(true).weight_decay(0.01));
       }},
      {"AdamW",
       [](Mlp& m) {
         return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions(0.01).betas({0.7, 0.9}));
       }},
      {"Adagrad",
       [](Mlp& m) {
         return std::make_unique<optim::Adagrad>(m.parameters(), optim::AdagradOptions(0.05).lr_decay(0.01));
       }},
      {"RMSprop",
       [](Mlp& m) {
         return std::make_unique<optim::RMSprop>(m.parameters(),
                                                 optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
       }},
  };
  for (const auto& [name, make] : optimizers) {
    INFO(name);
    TempDir dir;
    torch::manual_seed(8);
    Mlp model;
    auto optimizer = make(model);
    const fs::path folder = save_trained(dir.path, model, *optimizer, 3);
    torch::manual_seed(9);
    Mlp restored;
    Mlp fresh_model;
    auto restored_optimizer = make(restored);
    // Options changed after construction come back too.
    restored_optimizer->param_groups()[0].options().set_lr(123.0);
    ddp::load_checkpoint(folder, restored, restored_optimizer.get());
    CHECK(restored_optimizer->param_groups()[0].options().get_lr() ==
          optimizer->param_groups()[0].options().get_lr());
    train_steps(model, *optimizer, 2, 40);
    train_steps(restored, *restored_optimizer, 2, 40);
    require_same_state(ddp::state_dict(model), ddp::state_dict(restored));
    // The optimizer state mattered: a fresh optimizer on the loaded model ends elsewhere.
    ddp::load_checkpoint(folder, fresh_model, nullptr);
    auto fresh_optimizer = make(fresh_model);
    train_steps(fresh_model, *fresh_optimizer, 2, 40);
    CHECK_FALSE(torch::equal(ddp::state_dict(fresh_model)["fc1.weight"], ddp::state_dict(model)["fc1.weight"]));
  }
  // A checkpoint of SGD does not fit Adam: refused, and Adam keeps its own state.
  TempDir dir;
  Mlp model;
  optim::SGD sgd(model.parameters(), optim::SGDOptions(0.1).momentum(0.9));
  const fs::path folder = save_trained(dir.path, model, sgd, 1);
  optim::Adam adam(model.parameters(), optim::AdamOptions(0.01));
  train_steps(model, adam, 1, 50);
  const size_t states = adam.state().size();
  CHECK_THAT(io_error_of([&] { ddp::load_checkpoint(folder, model, &adam); }),
             Catch::Contains("trainer.pt") && Catch::Contains("param group 0"));
  CHECK(adam.state().size() == states);
  CHECK(adam.param_groups()[0].options().get_lr() == 0.01);
  optim::LBFGS lbfgs(model.parameters(), optim::LBFGSOptions(1));
  CHECK_THROWS_AS(ddp::save_checkpoint(dir.path, model, &lbfgs, {0, 9, {}}, 0, nullptr), ddp::InvalidArgument);
}

TEST_CASE("a trainer.pt of the earlier format (a TorchScript archive) is refused, never loaded", "[checkpoint]") {
  TempDir dir;
  Mlp model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const fs::path folder = save_trained(dir.path, model, optimizer, 5);
  // What the earlier code wrote into trainer.pt (writing one runs nothing; loading one could).
  torch::serialize::OutputArchive archive;
  archive.write("epoch", torch::tensor(int64_t{1}), /*is_buffer=*/true);
  torch::serialize::OutputArchive optimizer_archive;
  optimizer.save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  const fs::path old_trainer = dir.path / "old-trainer.pt";
  archive.save_to(old_trainer.string());
  plant(dir.path, 5, "trainer.pt", read_bytes(old_trainer));
  Mlp restored;
  const std::string error = io_error_of([&] { ddp::load_checkpoint(folder, restored, nullptr); });
  CHECK_THAT(error, Catch::Contains((folder / "trainer.pt").string()) &&
                        Catch::Contains("a TorchScript archive, which is never loaded"));
  // Its model.pt is a plain state dict and still loads.
  ddp::load_state_dict(restored, ddp::load_state_dict_file(folder / "model.pt"));
  require_same_state(ddp::state_dict(model), ddp::state_dict(restored));
}

TEST_CASE("a MANIFEST that is a FIFO or a symlink is refused without blocking", "[checkpoint]") {
  TempDir dir;
  Mlp model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1));
  const fs::path older = save_trained(dir.path, model, optimizer, 1);
  const fs::path fifo_folder = dir.path / ddp::checkpoint_name(2);
  const fs::path link_folder = dir.path / ddp::checkpoint_name(3);
  fs::create_directories(fifo_folder);
  fs::create_directories(link_folder);
  REQUIRE(::mkfifo((fifo_folder / "MANIFEST").c_str(), 0600) == 0);
  fs::create_symlink(older / "MANIFEST", link_folder / "MANIFEST");
  CHECK(ddp::list_checkpoints(dir.path).size() == 3);  // listed by name; opening the FIFO would block
  const auto candidates = ddp::inspect_checkpoints(dir.path);
  REQUIRE(candidates.size() == 3);
  CHECK_THAT(candidates[0].problem, Catch::Contains((link_folder / "MANIFEST").string()) &&
                                        Catch::Contains("not a regular file"));
  CHECK_THAT(candidates[1].problem, Catch::Contains((fifo_folder / "MANIFEST").string()) &&
                                        Catch::Contains("not a regular file"));
  CHECK(ddp::find_latest_valid_checkpoint(dir.path)->path == older);
  // Stopping at the newest valid one leaves older folders unread.
  save_trained(dir.path, model, optimizer, 4);
  const auto until_valid = ddp::inspect_checkpoints(dir.path, /*stop_at_first_valid=*/true);
  REQUIRE(until_valid.size() == 1);
  CHECK(until_valid[0].valid);
  CHECK(until_valid[0].step == 4);
}

// Python trains the same model with SGD (momentum) and with Adam, saves model.pt and a trainer.pt
// whose "optimizer" is optimizer.state_dict() as Python makes it, the input of one more step, and
// the parameters after that step.
const char* const kPythonOptimizerScript = R"py(
import sys, torch
folder = sys.argv[1]
class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 2)
    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))
makers = {'sgd': lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
          'adam': lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.95), amsgrad=True)}
for name, make in makers.items():
    torch.manual_seed(0)
    model = Mlp()
    optimizer = make(model.parameters())
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(6, 4)).pow(2).mean().backward()
        optimizer.step()
    torch.save(model.state_dict(), f'{folder}/{name}-model.pt')
    torch.save({'epoch': 1, 'step': 3, 'sampler': {'epoch': 1, 'position': 0, 'num_replicas': 1},
                'optimizer': optimizer.state_dict(), 'rng': None}, f'{folder}/{name}-trainer.pt')
    x = torch.randn(6, 4)
    torch.save({'x': x}, f'{folder}/{name}-input.pt')
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
    torch.save(model.state_dict(), f'{folder}/{name}-after.pt')
print('saved')
)py";

TEST_CASE("C++ continues from Python's optimizer.state_dict() (SGD and Adam) where Python does",
          "[checkpoint][python]") {
  if (!have_python()) {
    WARN("skipped: no Python with torch (configure with -DDDP_PYTHON=/path/to/python)");
    return;
  }
  TempDir dir;
  std::ofstream(dir.path / "optimizers.py") << kPythonOptimizerScript;
  const std::string output =
      run_command(ddp::str(DDP_PYTHON, " ", (dir.path / "optimizers.py").string(), " ", dir.path.string(), " 2>&1"));
  INFO(output);
  REQUIRE(output.find("saved") != std::string::npos);
  namespace optim = torch::optim;
  for (const std::string name : {"sgd", "adam"}) {
    INFO(name);
    const fs::path root = dir.path / name;
    std::vector<ddp::CheckpointFile> files;
    for (const std::string file : {"model.pt", "trainer.pt"}) {
      const auto bytes = read_bytes(dir.path / (name + "-" + file));
      files.push_back({file, [bytes](const ddp::ByteSink& sink) { sink(bytes.data(), bytes.size()); }});
    }
    const fs::path folder = ddp::write_checkpoint_directory(root, ddp::checkpoint_name(3), files, {{}, 1, 3, 1});
    Mlp model;
    std::unique_ptr<optim::Optimizer> optimizer;
    if (name == "sgd") {
      optimizer = std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions(1.0));
    } else {
      optimizer = std::make_unique<optim::Adam>(model.parameters(), optim::AdamOptions(1.0));
    }
    CHECK(ddp::load_checkpoint(folder, model, optimizer.get()).step == 3);
    CHECK(optimizer->param_groups()[0].options().get_lr() == (name == "sgd" ? 0.1 : 0.01));
    const torch::Tensor x = ddp::load_state_dict_file(dir.path / (name + "-input.pt"))["x"];
    optimizer->zero_grad();
    model.forward(x).pow(2).mean().backward();
    optimizer->step();
    const auto expected = ddp::load_state_dict_file(dir.path / (name + "-after.pt"));
    for (const auto& item : ddp::state_dict(model)) {
      INFO(item.key());
      CHECK(torch::allclose(item.value(), expected[item.key()], /*rtol=*/1e-5, /*atol=*/1e-7));
    }
  }
}
