// Fuzz entry of the checkpoint loader: MANIFEST (whole, and its parser past the end line), model.pt
// (zip and pickle), trainer.pt (zip, and the pickle with the optimizer state of SGD and of Adam);
// see Note [Fuzz inputs] in fuzz_entries.h. The pickle reader is ddp/checkpoint/detail/pickle_reader.cpp (see
// Note [Reading PyTorch pickles] in pickle_reader.h).
#include <sys/types.h>  // off_t, which in_memory_adapter.h uses without including it

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <stdexcept>

#include "ddp/base/str.h"
#include "ddp/checkpoint/checkpoint.h"
#include "ddp/checkpoint/detail/checkpoint_manifest.h"
#include "ddp/checkpoint/detail/trainer_state.h"
#include "tests/fuzz/fuzz_entries.h"

namespace ddp::fuzz {
namespace fs = std::filesystem;

namespace {

constexpr const char* kCheckpointName = "step-000000000007";

// The files of a real checkpoint of a small model and SGD with momentum, after one step.
struct Reference {
  std::vector<uint8_t> model;
  std::vector<uint8_t> trainer;
  std::vector<uint8_t> manifest;
  std::vector<uint8_t> adam_trainer;  // trainer.pt of SmallAdamTrainer
};

struct SmallTrainer {
  torch::nn::Linear model{3, 2};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
};

struct SmallAdamTrainer {
  torch::nn::Linear model{3, 2};
  torch::optim::Adam optimizer{model->parameters(), torch::optim::AdamOptions(0.01).amsgrad(true)};
};

// A checkpoint folder of `trainer` after one step, under scratch/reference.
template <typename Trainer>
fs::path save_reference(Trainer& trainer, const fs::path& scratch) {
  trainer.model->forward(torch::ones({4, 3})).sum().backward();
  trainer.optimizer.step();
  TrainingProgress progress;
  progress.epoch = 1;
  progress.step = 7;
  progress.sampler = {1, 5, 2};
  return save_checkpoint(scratch / "reference", *trainer.model, &trainer.optimizer, progress, 0, nullptr);
}

const Reference& reference(const fs::path& scratch) {
  static const Reference files = [&scratch] {
    SmallTrainer trainer;
    const fs::path folder = save_reference(trainer, scratch);
    Reference result{read_file(folder / "model.pt"), read_file(folder / "trainer.pt"),
                     read_file(folder / "MANIFEST"), {}};
    SmallAdamTrainer adam;
    result.adam_trainer = read_file(save_reference(adam, scratch) / "trainer.pt");
    fs::remove_all(scratch / "reference");
    return result;
  }();
  return files;
}

void check(bool condition, const std::string& what) {
  if (!condition) throw std::logic_error("broken invariant of a parsed input: " + what);
}

// Reads every element of a tensor (ASan sees a read past a storage).
void touch(const torch::Tensor& tensor) {
  if (!tensor.defined()) return;
  const torch::Tensor copy = tensor.clone();
  check(copy.sizes() == tensor.sizes(), "a clone has the tensor's shape");
}

void touch(const StateDict& state) {
  for (const auto& item : state) touch(item.value());
}

// Reads every tensor of a restored optimizer state.
void touch(const torch::optim::Optimizer& optimizer) {
  for (const auto& [key, state] : optimizer.state()) {
    if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) touch(sgd->momentum_buffer());
    if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state.get())) {
      touch(adam->exp_avg());
      touch(adam->exp_avg_sq());
      touch(adam->max_exp_avg_sq());
    }
  }
}

// trainer.pt with `pickle` as its data.pkl (see zip_with_pickle), read into trainer's optimizer.
template <typename Trainer>
void load_trainer_pickle(const std::vector<uint8_t>& trainer_file, const uint8_t* pickle, size_t size,
                         const fs::path& root);

// A model.pt whose zip and storage records are the reference's (plus a few of other sizes), with
// `pickle` as its data.pkl.
std::vector<uint8_t> zip_with_pickle(const std::vector<uint8_t>& model_file, const uint8_t* pickle,
                                     size_t pickle_size) {
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_unique<caffe2::serialize::MemoryReadAdapter>(model_file.data(), model_file.size()));
  std::vector<uint8_t> zip;
  caffe2::serialize::PyTorchStreamWriter writer([&zip](const void* data, size_t size) {
    zip.insert(zip.end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + size);
    return size;
  });
  for (const std::string& name : reader.getAllRecords()) {
    // The writer adds its own version and id records.
    if (name == "data.pkl" || name == "version" || name.rfind(".data/", 0) == 0) continue;
    auto [record, length] = reader.getRecord(name);
    writer.writeRecord(name, record.get(), length);
  }
  writer.writeRecord("data.pkl", pickle, pickle_size);
  // Storages of other sizes for mutated persistent ids: keys 90 (empty), 91 (1 byte), 92 (64 bytes).
  const std::vector<uint8_t> filler(64, 0x3f);
  writer.writeRecord("data/90", filler.data(), 0);
  writer.writeRecord("data/91", filler.data(), 1);
  writer.writeRecord("data/92", filler.data(), filler.size());
  writer.writeEndOfFile();
  return zip;
}

template <typename Trainer>
void load_trainer_pickle(const std::vector<uint8_t>& trainer_file, const uint8_t* pickle, size_t size,
                         const fs::path& root) {
  const std::vector<uint8_t> zip = zip_with_pickle(trainer_file, pickle, size);
  const fs::path file = root / "trainer.pt";
  write_file(file, zip.data(), zip.size());
  Trainer trainer;
  detail::read_trainer_state(file, &trainer.optimizer, torch::kCPU, /*restore_rng=*/true);
  touch(trainer.optimizer);
}

}  // namespace

Outcome checkpoint_entry(const uint8_t* data, size_t size, const fs::path& scratch) {
  const Reference& files = reference(scratch);
  const int mode = size > 0 ? data[0] % 7 : 0;
  const uint8_t* content = size > 0 ? data + 1 : data;
  const size_t content_size = size > 0 ? size - 1 : 0;
  const fs::path root = scratch / "checkpoints";
  fs::remove_all(root);
  fs::create_directories(root);
  try {
    switch (mode) {
      case 0: {  // MANIFEST
        const fs::path folder = root / kCheckpointName;
        fs::create_directories(folder);
        write_file(folder / "model.pt", files.model.data(), files.model.size());
        write_file(folder / "trainer.pt", files.trainer.data(), files.trainer.size());
        write_file(folder / "MANIFEST", content, content_size);
        const auto listed = list_checkpoints(root);
        check(listed.size() == 1 && listed.front().path == folder, "the checkpoint is listed");
        SmallTrainer trainer;  // load_checkpoint verifies the MANIFEST and checksums first
        load_checkpoint(folder, *trainer.model, &trainer.optimizer);
        break;
      }
      case 1:
      case 2: {  // model.pt as given, or its data.pkl
        const fs::path file = root / "model.pt";
        if (mode == 1) {
          write_file(file, content, content_size);
        } else {
          const std::vector<uint8_t> zip = zip_with_pickle(files.model, content, content_size);
          write_file(file, zip.data(), zip.size());
        }
        touch(load_state_dict_file(file));
        break;
      }
      case 4: {  // the MANIFEST's lines, with an end line that matches them (the parser past it)
        std::string text(reinterpret_cast<const char*>(content), content_size);
        if (!text.empty() && text.back() != '\n') text += '\n';
        text += str("end ", std::count(text.begin(), text.end(), '\n'), " ", detail::hex_digest(detail::checksum_of(text)), "\n");
        const detail::Manifest manifest = detail::parse_manifest(text, root / "MANIFEST");
        for (const auto& file : manifest.files) {
          check(file.name.find('/') == std::string::npos && file.name != ".." && file.name != ".",
                "MANIFEST names are plain file names");
        }
        break;
      }
      case 5:  // trainer.pt's data.pkl: progress, SGD state, RNG
        load_trainer_pickle<SmallTrainer>(files.trainer, content, content_size, root);
        break;
      case 6:  // the same with Adam's state (amsgrad)
        load_trainer_pickle<SmallAdamTrainer>(files.adam_trainer, content, content_size, root);
        break;
      default: {  // trainer.pt, under a MANIFEST that matches it
        const std::vector<CheckpointFile> written = {
            {"model.pt", [&](const ByteSink& sink) { sink(files.model.data(), files.model.size()); }},
            {"trainer.pt", [&](const ByteSink& sink) { sink(content, content_size); }}};
        const fs::path folder = write_checkpoint_directory(root, kCheckpointName, written,
                                                           {root / kCheckpointName, 1, 7, 1});
        SmallTrainer trainer;
        load_checkpoint(folder, *trainer.model, &trainer.optimizer);
      }
    }
    return {true, ""};
  } catch (const ddp::Error& e) {
    return rejected(e);
  }
}

void write_checkpoint_seeds(const fs::path& corpus, const fs::path& scratch) {
  fs::create_directories(scratch);
  const Reference& files = reference(scratch);
  const fs::path folder = corpus / "checkpoint";
  fs::create_directories(folder);
  const auto seed = [&folder](const std::string& name, uint8_t mode, const std::vector<uint8_t>& content) {
    std::vector<uint8_t> input{mode};
    input.insert(input.end(), content.begin(), content.end());
    write_file(folder / name, input.data(), input.size());
  };
  seed("manifest", 0, files.manifest);
  seed("model-pt", 1, files.model);
  seed("trainer-pt", 3, files.trainer);
  const auto data_pkl = [](const std::vector<uint8_t>& zip) {
    caffe2::serialize::PyTorchStreamReader reader(
        std::make_unique<caffe2::serialize::MemoryReadAdapter>(zip.data(), zip.size()));
    auto [pickle, pickle_size] = reader.getRecord("data.pkl");
    const auto* bytes = static_cast<const uint8_t*>(pickle.get());
    return std::vector<uint8_t>(bytes, bytes + pickle_size);
  };
  seed("model-data-pkl", 2, data_pkl(files.model));
  // The MANIFEST without its end line, which mode 4 recomputes.
  const std::string manifest(files.manifest.begin(), files.manifest.end());
  const std::string body = manifest.substr(0, manifest.rfind("end "));
  seed("manifest-body", 4, std::vector<uint8_t>(body.begin(), body.end()));
  seed("trainer-data-pkl-sgd", 5, data_pkl(files.trainer));
  seed("trainer-data-pkl-adam", 6, data_pkl(files.adam_trainer));
}

}  // namespace ddp::fuzz
