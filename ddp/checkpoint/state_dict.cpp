// State dicts: a module's parameters and buffers by name, and their files in PyTorch's zip format.
#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "ddp/base/str.h"
#include "ddp/checkpoint/checkpoint.h"
#include "ddp/checkpoint/detail/checkpoint_manifest.h"
#include "ddp/checkpoint/detail/torch_zip.h"

namespace ddp {
namespace fs = std::filesystem;

void detail::write_state_dict(const StateDict& state, const ByteSink& sink) {
  c10::impl::GenericDict dict = detail::string_dict();
  for (const auto& item : state) dict.insert(item.key(), item.value().detach().to(torch::kCPU));
  detail::write_torch_zip(dict, sink);
}

StateDict state_dict(const torch::nn::Module& module) {
  StateDict state;
  // Module by module, parameters then buffers: the order of PyTorch's state_dict().
  const auto add_own = [&state](const std::string& prefix, const torch::nn::Module& owner) {
    for (const auto& parameter : owner.named_parameters(/*recurse=*/false)) {
      state.insert(prefix + parameter.key(), parameter.value().detach());
    }
    for (const auto& buffer : owner.named_buffers(/*recurse=*/false)) {
      state.insert(prefix + buffer.key(), buffer.value().detach());
    }
  };
  add_own("", module);
  // include_self = false: the module itself need not be owned by a shared_ptr.
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    add_own(item.key() + ".", *item.value());
  }
  return strip_prefix(state);
}

StateDict strip_prefix(const StateDict& state, const std::string& prefix) {
  StateDict result;
  for (const auto& item : state) {
    const std::string& key = item.key();
    const bool prefixed = key.compare(0, prefix.size(), prefix) == 0;
    result.insert(prefixed ? key.substr(prefix.size()) : key, item.value());
  }
  return result;
}

void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  const StateDict source = strip_prefix(state);
  const StateDict target = state_dict(module);
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  for (const auto& item : target) {
    if (!source.contains(item.key())) missing.push_back(item.key());
  }
  for (const auto& item : source) {
    if (!target.contains(item.key())) unexpected.push_back(item.key());
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    throw InvalidArgument(str("load_state_dict: the state dict does not fit the model: missing keys [",
                              join(missing, ", "), "], unexpected keys [", join(unexpected, ", "),
                              "] (pass strict = false to load the common keys only)"));
  }
  for (const auto& item : target) {
    if (const torch::Tensor* value = source.find(item.key())) {
      if (value->sizes() != item.value().sizes()) {
        throw InvalidArgument(str("load_state_dict: ", item.key(), " has shape ", item.value().sizes(),
                                  " in the model but ", value->sizes(), " in the state dict"));
      }
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& item : target) {
    // item.value(): a detached alias of the parameter or buffer.
    if (const torch::Tensor* value = source.find(item.key())) item.value().copy_(*value);
  }
}

void save_state_dict(const StateDict& state, const fs::path& file) {
  const fs::path directory = file.has_parent_path() ? file.parent_path() : fs::path(".");
  detail::TemporaryFile created = detail::create_temporary_sibling(file.string(), 0644);  // as readable as before
  const fs::path temporary = created.path;
  try {
    detail::OutputFile out(temporary, std::move(created.fd));
    detail::write_state_dict(state, [&out](const void* data, size_t size) { out.write(data, size); });
    out.commit();
    detail::rename_or_throw(temporary, file);
    detail::fsync_path(directory.string());
  } catch (...) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw;
  }
}

StateDict load_state_dict_file(const fs::path& file, std::optional<torch::Device> map_location) {
  const detail::PickleValue root = detail::read_torch_zip(file, "state dict");
  if (root.kind != detail::PickleValue::Kind::kDict) {
    throw IoError(str(file.string(), ": holds no dict: a state dict (name -> tensor) was expected"));
  }
  StateDict state;
  for (const auto& [key, value] : *root.entries) {
    if (key.kind != detail::PickleValue::Kind::kString || value.kind != detail::PickleValue::Kind::kTensor) {
      throw IoError(str(file.string(), ": entry ", key.kind == detail::PickleValue::Kind::kString ? key.text : "?",
                        " is not a tensor by name: a state dict (name -> tensor) was expected"));
    }
    state.insert(key.text, map_location ? value.tensor.to(*map_location) : value.tensor);
  }
  return strip_prefix(state);
}

}  // namespace ddp
