#include "ddp/checkpoint/detail/torch_zip.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/base/str.h"

namespace ddp::detail {
namespace fs = std::filesystem;

namespace {

// The first sentence of a c10::Error, on one line, without LibTorch's long hints and backtrace.
std::string short_reason(const c10::Error& error) {
  std::string message = error.what_without_backtrace();
  const auto end = message.find(". ");
  if (end != std::string::npos) message.resize(end);
  return first_line(message);
}

}  // namespace

c10::impl::GenericList any_list() { return c10::impl::GenericList(c10::AnyType::get()); }

c10::impl::GenericDict string_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// LibTorch's own Pickler and zip writer. Aggregate type tags are off: with them Python's torch.load
// (weights_only, its default) refuses the file.
void write_torch_zip(const c10::IValue& value, const ByteSink& sink) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&pickle](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer([&sink](const void* data, size_t size) {
    sink(data, size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
}

PickleValue read_torch_zip(const fs::path& file, const std::string& what) {
  std::error_code error;
  const auto size = fs::file_size(file, error);
  if (error) throw IoError(str(file.string(), ": cannot read the ", what, ": ", error.message()));
  char magic[4] = {};
  std::ifstream(file, std::ios::binary).read(magic, 4);
  if (size < 22 || std::memcmp(magic, "PK\x03\x04", 4) != 0) {
    throw IoError(str(file.string(), ": not a PyTorch zip file (", size,
                      " bytes): truncated, corrupt, or saved in the legacy format "
                      "(_use_new_zipfile_serialization=False)"));
  }
  try {
    caffe2::serialize::PyTorchStreamReader reader(file.string());
    if (reader.hasRecord("byteorder")) {
      auto [bytes, length] = reader.getRecord("byteorder");
      const std::string order(static_cast<const char*>(bytes.get()), length);
      if (order != "little") throw IoError(str(file.string(), ": byte order '", order, "' is not supported"));
    }
    auto [pickle, pickle_size] = reader.getRecord("data.pkl");
    std::map<std::string, torch::Tensor> storages;  // shared storages stay shared
    const StorageLoader load_storage = [&](const std::string& key, torch::ScalarType dtype, int64_t numel) {
      auto& storage = storages[key];
      if (storage.defined()) return storage;
      const std::string record = "data/" + key;
      auto [data, length] = reader.getRecord(record);
      const auto element = c10::elementSize(dtype);
      // Checked by division: a corrupt numel times the element size can wrap around to the length.
      if (numel < 0 || length % element != 0 || length / element != static_cast<size_t>(numel)) {
        throw IoError(str(file.string(), ": record ", record, " has ", length, " bytes, not the ", numel,
                          " elements of ", c10::toString(dtype), " (", element, " bytes each) the pickle promises"));
      }
      storage = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
      if (length > 0) std::memcpy(storage.data_ptr(), data.get(), length);
      return storage;
    };
    return read_pickle(file.string(), what, static_cast<const char*>(pickle.get()), pickle_size, load_storage);
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw IoError(str(file.string(), ": truncated or corrupt: ", short_reason(e)));
  } catch (const std::exception& e) {  // e.g. std::bad_alloc for sizes from a corrupt file
    throw IoError(str(file.string(), ": truncated or corrupt: ", first_line(e.what())));
  }
}

}  // namespace ddp::detail
