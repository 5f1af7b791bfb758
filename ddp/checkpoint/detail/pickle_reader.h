#pragma once
// The project's safe reader of Python pickles: every checkpoint file (model.pt, trainer.pt) is read
// through it, never through LibTorch's unpickler or TorchScript. See Note [Reading PyTorch pickles].
// Internal to the ddp library (and its tests and fuzzers).
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp::detail {

// Note [Reading PyTorch pickles]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch's unpickler turns collections.OrderedDict into None (it expects one only as a tensor's
// empty backward hooks), so it cannot read Python's torch.save(model.state_dict()); and LibTorch's
// other readers (torch::serialize::InputArchive, torch::jit::load) load TorchScript, whose
// __setstate__ methods run code: a planted file would run with the job's rights. This reader
// understands the part of pickle (protocols 2 to 5) that state dicts and optimizer state dicts use:
// dicts and OrderedDicts (whose _metadata it drops), tuples, lists, None, booleans, integers,
// floats, strings, and tensors rebuilt by torch._utils._rebuild_tensor_v2 / _rebuild_parameter from
// the zip's data/<key> records. Any other Python object (GLOBAL, REDUCE or NEWOBJ of anything else,
// BUILD of a class) is refused with an error naming the file: nothing is ever called or executed.
// That is the same set that Python's torch.load(weights_only=True) accepts for these files.

// One value of a pickle, as a tree.
struct PickleValue {
  enum class Kind { kNone, kBoolean, kInteger, kReal, kString, kTuple, kList, kDict, kGlobal, kTensor };
  Kind kind = Kind::kNone;
  int64_t integer = 0;  // also a boolean's 0 or 1
  double real = 0;
  std::string text;                                    // string; "module.name" of a global
  std::shared_ptr<std::vector<PickleValue>> items;     // tuple, list
  std::shared_ptr<std::vector<std::pair<PickleValue, PickleValue>>> entries;  // dict, in order
  torch::Tensor tensor;                                // tensor; for storages a 1-D tensor

  PickleValue() = default;
  PickleValue(const PickleValue&) = default;
  PickleValue(PickleValue&&) = default;
  PickleValue& operator=(const PickleValue&) = default;
  PickleValue& operator=(PickleValue&&) = default;
  ~PickleValue() { release_children(); }

  static PickleValue of(Kind kind);

  bool is_container() const { return items != nullptr || entries != nullptr; }

  // The value of a dict's entry whose key is the string `key`; nullptr when this is no dict or has no
  // such entry.
  const PickleValue* find(const std::string& key) const;

 private:
  void release_children();  // See Note [Deep pickles] in pickle_reader.cpp.
};

// Loads the storage record `key` of the zip: numel elements of dtype, as a 1-D CPU tensor.
using StorageLoader =
    std::function<torch::Tensor(const std::string& key, torch::ScalarType dtype, int64_t numel)>;

// Reads the pickle `data` (from the file `file`, named in errors; `what` says what the file should
// hold, e.g. "state dict") into a tree. Throws ddp::IoError "<file>: not a readable <what>: ..." for
// anything outside what it reads (see Note [Reading PyTorch pickles]).
PickleValue read_pickle(const std::string& file, const std::string& what, const char* data, size_t size,
                        const StorageLoader& load_storage);

}  // namespace ddp::detail
