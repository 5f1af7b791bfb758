#pragma once
// PyTorch's zip format (what torch.save writes) for checkpoint files: written through LibTorch's
// Pickler and zip writer, read through the project's safe pickle reader (ddp/checkpoint/detail/pickle_reader.h), never
// through LibTorch's unpickler or TorchScript. Internal to the ddp library.
#include <ATen/core/ivalue.h>

#include <filesystem>
#include <string>

#include "ddp/checkpoint/checkpoint.h"
#include "ddp/checkpoint/detail/pickle_reader.h"

namespace ddp::detail {

// Writes `value` (dicts, lists, tuples, None, booleans, integers, floats, strings and tensors) as a
// PyTorch zip file: Python's torch.load(file, weights_only=True) gives the same structure back.
// Tensors are moved to the CPU. Lists and dicts must be generic (element type Any): typed lists
// are pickled as TorchScript calls that weights_only refuses.
void write_torch_zip(const c10::IValue& value, const ByteSink& sink);

// Reads a PyTorch zip file written by write_torch_zip() or by Python's torch.save() into a tree;
// tensors are on the CPU. `what` names the expected contents in errors ("state dict"). A missing,
// truncated or corrupt file, or one that holds any other Python object, is a ddp::IoError that
// names the file and what is wrong, on one line.
PickleValue read_torch_zip(const std::filesystem::path& file, const std::string& what);

// Writes a state dict as write_torch_zip() does: Python's torch.load gives a dict name -> tensor.
void write_state_dict(const StateDict& state, const ByteSink& sink);

// A generic (element type Any) list and string-keyed dict, for write_torch_zip().
c10::impl::GenericList any_list();
c10::impl::GenericDict string_dict();

}  // namespace ddp::detail
