#include "ddp/checkpoint.h"

#include <ATen/Context.h>
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/cuda.h>
#include <torch/serialize/archive.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "ddp/base/error.h"
#include "ddp/log.h"
#include "ddp/process_group.h"

namespace ddp {
namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "MANIFEST";
constexpr const char* kManifestHeader = "ddp-checkpoint 1";
constexpr const char* kModelFile = "model.pt";
constexpr const char* kTrainerFile = "trainer.pt";

// ---- Files ------------------------------------------------------------------------------------------

// Note [Checksum]
// Detects truncated and corrupted files (PyTorch's zip reader does not check its CRCs). Each 8-byte
// word goes through h = mix(h ^ word), mix being a bijection, so a change confined to one word always
// changes the digest; the length is mixed in at the end. Not cryptographic; about 4 GB/s.
class Checksum {
 public:
  void update(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    length_ += size;
    while (size > 0 && pending_size_ > 0) {
      pending_[pending_size_++] = *bytes++;
      --size;
      if (pending_size_ == 8) {
        mix(load(pending_));
        pending_size_ = 0;
      }
    }
    for (; size >= 8; bytes += 8, size -= 8) mix(load(bytes));
    for (; size > 0; --size) pending_[pending_size_++] = *bytes++;
  }

  uint64_t digest() const {
    Checksum copy = *this;
    unsigned char tail[8] = {};
    std::memcpy(tail, copy.pending_, copy.pending_size_);
    copy.mix(load(tail));
    copy.mix(copy.length_);
    return copy.hash_;
  }

 private:
  static uint64_t load(const unsigned char* bytes) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);
    return word;
  }
  void mix(uint64_t word) {
    hash_ = (hash_ ^ word) * 0x9E3779B97F4A7C15ull;
    hash_ ^= hash_ >> 32;
  }

  uint64_t hash_ = 0xcbf29ce484222325ull;
  uint64_t length_ = 0;
  unsigned char pending_[8] = {};
  size_t pending_size_ = 0;
};

std::string hex(uint64_t value) {
  std::ostringstream out;
  out << std::hex;
  out.width(16);
  out.fill('0');
  out << value;
  return out.str();
}

[[noreturn]] void throw_errno(const std::string& what, const fs::path& path) {
  throw IoError(str(what, " ", path.string(), ": ", std::strerror(errno)));
}

// A file written with POSIX calls so that it can be fsynced; counts and checksums what it writes.
class OutputFile {
 public:
  explicit OutputFile(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_errno("cannot create", path_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  void write(const void* data, size_t size) {
    checksum_.update(data, size);
    size_ += size;
    const auto* bytes = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t written = ::write(fd_, bytes, size);
      if (written < 0) {
        if (errno == EINTR) continue;
        throw_errno("cannot write", path_);
      }
      bytes += written;
      size -= static_cast<size_t>(written);
    }
  }

  // fsync and close: after this the bytes are on disk.
  void commit() {
    if (::fsync(fd_) != 0) throw_errno("cannot fsync", path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_errno("cannot close", path_);
  }

  uint64_t size() const { return size_; }
  uint64_t digest() const { return checksum_.digest(); }

 private:
  fs::path path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  Checksum checksum_;
};

void fsync_directory(const fs::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open directory", directory);
  const int result = ::fsync(fd);
  ::close(fd);
  if (result != 0) throw_errno("cannot fsync directory", directory);
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw IoError(str("cannot rename ", from.string(), " to ", to.string(), ": ", std::strerror(errno)));
  }
}

// A unique name for a temporary sibling of `name` in the same folder (rename stays atomic).
std::string temporary_name(const std::string& kind, const std::string& name) {
  static std::atomic<uint64_t> counter{0};
  return str(".", kind, "-", name, "-", ::getpid(), "-", counter++);
}

struct FileDigest {
  uint64_t size = 0;
  uint64_t checksum = 0;
};

FileDigest digest_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str(path.string(), ": cannot open: ", std::strerror(errno)));
  Checksum checksum;
  FileDigest result;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<size_t>(in.gcount());
    checksum.update(buffer.data(), got);
    result.size += got;
  }
  if (in.bad()) throw IoError(str(path.string(), ": read error: ", std::strerror(errno)));
  result.checksum = checksum.digest();
  return result;
}

// ---- Writing state dicts ------------------------------------------------------------------------------

// PyTorch's zip format through LibTorch's own Pickler and zip writer. Aggregate type tags are off:
// with them Python's torch.load (weights_only, its default) refuses the file.
void write_state_dict(const StateDict& state, const ByteSink& sink) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& item : state) dict.insert(item.key(), item.value().detach().to(torch::kCPU));
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&pickle](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer([&sink](const void* data, size_t size) {
    sink(data, size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
}

// ---- Reading state dicts ------------------------------------------------------------------------------

// Note [Reading PyTorch state dicts]
// LibTorch's unpickler turns collections.OrderedDict into None (it expects one only as a tensor's
// empty backward hooks), so it cannot read Python's torch.save(model.state_dict()). This reader
// understands the part of pickle (protocols 2 to 5) that state dicts use: dicts and OrderedDicts
// (whose _metadata it drops), tuples, lists, scalars, strings, and tensors rebuilt by
// torch._utils._rebuild_tensor_v2 / _rebuild_parameter from the zip's data/<key> records. Any other
// Python object is refused with an error, never executed.
struct PickleValue {
  enum class Kind { none, boolean, integer, real, string, tuple, list, dict, global, tensor };
  Kind kind = Kind::none;
  int64_t integer = 0;
  double real = 0;
  std::string text;                                    // string; "module.name" of a global
  std::shared_ptr<std::vector<PickleValue>> items;     // tuple, list
  std::shared_ptr<std::vector<std::pair<PickleValue, PickleValue>>> entries;  // dict
  torch::Tensor tensor;                                // tensor; for storages a 1-D tensor

  PickleValue() = default;
  PickleValue(const PickleValue&) = default;
  PickleValue(PickleValue&&) = default;
  PickleValue& operator=(const PickleValue&) = default;
  PickleValue& operator=(PickleValue&&) = default;
  ~PickleValue() { release_children(); }

  static PickleValue of(Kind kind) {
    PickleValue value;
    value.kind = kind;
    if (kind == Kind::tuple || kind == Kind::list) {
      value.items = std::make_shared<std::vector<PickleValue>>();
    }
    if (kind == Kind::dict) {
      value.entries = std::make_shared<std::vector<std::pair<PickleValue, PickleValue>>>();
    }
    return value;
  }

  bool is_container() const { return items != nullptr || entries != nullptr; }

 private:
  // Note [Deep pickles]
  // A pickle of n bytes can nest lists n/2 deep; the implicit destructor would recurse once per
  // level and overflow the stack (tests/fuzz/regressions/checkpoint/pickle-deep-nesting). Children
  // of containers whose last owner this is are moved to a work list instead and destroyed one at a
  // time, their own children already moved out.
  void release_children() {
    std::vector<PickleValue> pending;
    const auto adopt = [&pending](PickleValue& value) {
      if (value.items && value.items.use_count() == 1) {
        for (auto& child : *value.items) {
          if (child.is_container()) pending.push_back(std::move(child));
        }
      }
      if (value.entries && value.entries.use_count() == 1) {
        for (auto& [key, child] : *value.entries) {
          if (key.is_container()) pending.push_back(std::move(key));
          if (child.is_container()) pending.push_back(std::move(child));
        }
      }
      value.items.reset();
      value.entries.reset();
    };
    adopt(*this);
    while (!pending.empty()) {
      PickleValue value = std::move(pending.back());
      pending.pop_back();
      adopt(value);
    }
  }
};

// Whether `container`'s items or entries are reachable from `value` (iterative: see Note [Deep pickles]).
// Each value looked at costs one unit of `budget`; false with budget 0 when it runs out.
bool reaches(const PickleValue& value, const void* container, size_t& budget) {
  std::vector<const PickleValue*> pending{&value};
  std::unordered_set<const void*> seen;
  while (!pending.empty() && budget > 0) {
    --budget;
    const PickleValue* current = pending.back();
    pending.pop_back();
    const void* id = current->items ? static_cast<const void*>(current->items.get())
                                    : static_cast<const void*>(current->entries.get());
    if (id == nullptr) continue;
    if (id == container) return true;
    if (!seen.insert(id).second) continue;
    if (current->items) {
      for (const auto& child : *current->items) pending.push_back(&child);
    } else {
      for (const auto& [key, child] : *current->entries) {
        pending.push_back(&key);
        pending.push_back(&child);
      }
    }
  }
  return false;
}

using StorageLoader = std::function<torch::Tensor(const std::string& key, torch::ScalarType dtype,
                                                  int64_t numel)>;

std::optional<torch::ScalarType> storage_dtype(const std::string& global) {
  static const std::map<std::string, torch::ScalarType> types = {
      {"torch.FloatStorage", torch::kFloat},       {"torch.DoubleStorage", torch::kDouble},
      {"torch.HalfStorage", torch::kHalf},         {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kLong},         {"torch.IntStorage", torch::kInt},
      {"torch.ShortStorage", torch::kShort},       {"torch.CharStorage", torch::kChar},
      {"torch.ByteStorage", torch::kByte},         {"torch.BoolStorage", torch::kBool},
      {"torch.ComplexFloatStorage", torch::kComplexFloat},
      {"torch.ComplexDoubleStorage", torch::kComplexDouble}};
  const auto found = types.find(global);
  if (found == types.end()) return std::nullopt;
  return found->second;
}

class StateDictUnpickler {
 public:
  StateDictUnpickler(std::string file, const char* data, size_t size, StorageLoader load_storage)
      : file_(std::move(file)), data_(data), size_(size), load_storage_(std::move(load_storage)) {}

  PickleValue run() {
    while (true) {
      const auto opcode = static_cast<unsigned char>(read(1)[0]);
      if (opcode == '.') break;  // STOP
      step(opcode);
    }
    if (stack_.size() != 1) fail(str("pickle ends with ", stack_.size(), " values on the stack"));
    return stack_.back();
  }

 private:
  using Kind = PickleValue::Kind;

  [[noreturn]] void fail(const std::string& what) const {
    throw IoError(str(file_, ": not a readable state dict: ", what, " (byte ", position_,
                      " of data.pkl)"));
  }

  const char* read(size_t count) {
    if (count > size_ - position_) fail("the pickle data ends early (truncated or corrupt)");
    const char* start = data_ + position_;
    position_ += count;
    return start;
  }
  template <typename T>
  T read_little_endian() {
    T value;
    std::memcpy(&value, read(sizeof(T)), sizeof(T));  // the pickle format and x86/ARM: little-endian
    return value;
  }
  std::string read_line() {
    const char* start = data_ + position_;
    const void* end = std::memchr(start, '\n', size_ - position_);
    if (end == nullptr) fail("unterminated GLOBAL name");
    const auto length = static_cast<size_t>(static_cast<const char*>(end) - start);
    position_ += length + 1;
    return std::string(start, length);
  }

  PickleValue pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("stack underflow");
    PickleValue value = std::move(stack_.back());
    stack_.pop_back();
    return value;
  }
  PickleValue& top() {
    if (stack_.empty()) fail("stack underflow");
    return stack_.back();
  }
  // The values since the last MARK, which is removed.
  std::vector<PickleValue> pop_to_mark() {
    if (marks_.empty()) fail("no MARK");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleValue> values(std::make_move_iterator(stack_.begin() + static_cast<long>(mark)),
                                    std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return values;
  }
  void push_tuple(std::vector<PickleValue> values) {
    PickleValue tuple = PickleValue::of(Kind::tuple);
    *tuple.items = std::move(values);
    stack_.push_back(std::move(tuple));
  }
  void push_string(size_t length) {
    PickleValue value = PickleValue::of(Kind::string);
    value.text.assign(read(length), length);
    stack_.push_back(std::move(value));
  }
  void push_integer(int64_t integer) {
    PickleValue value = PickleValue::of(Kind::integer);
    value.integer = integer;
    stack_.push_back(std::move(value));
  }
  void memoize(uint32_t index) { memo_[index] = top(); }
  void push_memo(uint32_t index) {
    const auto found = memo_.find(index);
    if (found == memo_.end()) fail(str("memo entry ", index, " is missing"));
    stack_.push_back(found->second);
  }
  PickleValue& expect(PickleValue& value, Kind kind, const char* what) {
    if (value.kind != kind) fail(str("expected ", what));
    return value;
  }
  // Containers shared through the memo could otherwise own each other: a reference cycle leaks.
  // Only a container with another owner than the stack (the memo) can be inside `value`; the
  // search has a budget so that a pickle made of shared containers cannot take quadratic time.
  void refuse_cycle(const PickleValue& container, const PickleValue& value) {
    const long owners = container.items ? container.items.use_count() : container.entries.use_count();
    if (!value.is_container() || owners <= 1) return;
    const void* id = container.items ? static_cast<const void*>(container.items.get())
                                     : static_cast<const void*>(container.entries.get());
    if (reaches(value, id, cycle_check_budget_)) fail("a list or dict cannot contain itself");
    if (cycle_check_budget_ == 0) fail("too many shared lists and dicts (not a state dict)");
  }
  void set_items(PickleValue& dict, std::vector<PickleValue>& flat) {
    expect(dict, Kind::dict, "a dict for SETITEMS");
    if (flat.size() % 2 != 0) fail("odd number of values for SETITEMS");
    for (const auto& value : flat) refuse_cycle(dict, value);
    for (size_t i = 0; i < flat.size(); i += 2) {
      dict.entries->emplace_back(std::move(flat[i]), std::move(flat[i + 1]));
    }
  }

  void step(unsigned char opcode) {
    switch (opcode) {
      case 0x80: read(1); break;     // PROTO
      case 0x95: read(8); break;     // FRAME
      case '(': marks_.push_back(stack_.size()); break;  // MARK
      case 'N': stack_.push_back(PickleValue::of(Kind::none)); break;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        PickleValue value = PickleValue::of(Kind::boolean);
        value.integer = opcode == 0x88;
        stack_.push_back(std::move(value));
        break;
      }
      case 'K': push_integer(static_cast<unsigned char>(read(1)[0])); break;  // BININT1
      case 'M': push_integer(read_little_endian<uint16_t>()); break;           // BININT2
      case 'J': push_integer(read_little_endian<int32_t>()); break;            // BININT
      case 0x8a: {  // LONG1
        const auto length = static_cast<unsigned char>(read(1)[0]);
        if (length > 8) fail("integer wider than 64 bits");
        const char* bytes = read(length);
        uint64_t bits = 0;
        for (size_t i = 0; i < length; ++i) bits |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
        if (length > 0 && length < 8 && (bytes[length - 1] & 0x80)) bits |= ~uint64_t{0} << (8 * length);
        push_integer(static_cast<int64_t>(bits));
        break;
      }
      case 'G': {  // BINFLOAT: big-endian double
        const char* bytes = read(8);
        unsigned char swapped[8];
        for (int i = 0; i < 8; ++i) swapped[i] = static_cast<unsigned char>(bytes[7 - i]);
        PickleValue value = PickleValue::of(Kind::real);
        std::memcpy(&value.real, swapped, 8);
        stack_.push_back(std::move(value));
        break;
      }
      case 'X': push_string(read_little_endian<uint32_t>()); break;                      // BINUNICODE
      case 0x8c: push_string(static_cast<unsigned char>(read(1)[0])); break;             // SHORT_BINUNICODE
      case 0x8d: push_string(static_cast<size_t>(read_little_endian<uint64_t>())); break;  // BINUNICODE8
      case 'c': {  // GLOBAL
        const std::string module = read_line();
        const std::string name = read_line();
        PickleValue value = PickleValue::of(Kind::global);
        value.text = module + "." + name;
        stack_.push_back(std::move(value));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        PickleValue name = pop();
        PickleValue module = pop();
        if (name.kind != Kind::string || module.kind != Kind::string) fail("STACK_GLOBAL needs strings");
        PickleValue value = PickleValue::of(Kind::global);
        value.text = module.text + "." + name.text;
        stack_.push_back(std::move(value));
        break;
      }
      case ')': push_tuple({}); break;  // EMPTY_TUPLE
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<PickleValue> values(static_cast<size_t>(opcode - 0x84));
        for (auto it = values.rbegin(); it != values.rend(); ++it) *it = pop();
        push_tuple(std::move(values));
        break;
      }
      case 't': push_tuple(pop_to_mark()); break;  // TUPLE
      case ']': stack_.push_back(PickleValue::of(Kind::list)); break;
      case 'l': {  // LIST
        PickleValue list = PickleValue::of(Kind::list);
        *list.items = pop_to_mark();
        stack_.push_back(std::move(list));
        break;
      }
      case 'a': {  // APPEND
        PickleValue value = pop();
        PickleValue& list = expect(top(), Kind::list, "a list for APPEND");
        refuse_cycle(list, value);
        list.items->push_back(std::move(value));
        break;
      }
      case 'e': {  // APPENDS
        std::vector<PickleValue> values = pop_to_mark();
        PickleValue& list = expect(top(), Kind::list, "a list for APPENDS");
        for (const auto& value : values) refuse_cycle(list, value);
        for (auto& value : values) list.items->push_back(std::move(value));
        break;
      }
      case '}': stack_.push_back(PickleValue::of(Kind::dict)); break;  // EMPTY_DICT
      case 'd': {  // DICT
        std::vector<PickleValue> flat = pop_to_mark();
        PickleValue dict = PickleValue::of(Kind::dict);
        set_items(dict, flat);
        stack_.push_back(std::move(dict));
        break;
      }
      case 's': {  // SETITEM
        std::vector<PickleValue> flat(2);
        flat[1] = pop();
        flat[0] = pop();
        set_items(top(), flat);
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<PickleValue> flat = pop_to_mark();
        set_items(top(), flat);
        break;
      }
      case 'q': memoize(static_cast<unsigned char>(read(1)[0])); break;  // BINPUT
      case 'r': memoize(read_little_endian<uint32_t>()); break;          // LONG_BINPUT
      case 0x94: memoize(static_cast<uint32_t>(memo_.size())); break;    // MEMOIZE
      case 'h': push_memo(static_cast<unsigned char>(read(1)[0])); break;  // BINGET
      case 'j': push_memo(read_little_endian<uint32_t>()); break;          // LONG_BINGET
      case 'R':                                                            // REDUCE
      case 0x81: {                                                         // NEWOBJ
        PickleValue arguments = pop();
        PickleValue callable = pop();
        if (callable.kind != Kind::global || arguments.kind != Kind::tuple) fail("REDUCE needs a global and a tuple");
        stack_.push_back(call(callable.text, *arguments.items));
        break;
      }
      case 'b': {  // BUILD: an OrderedDict's _metadata or a tensor's state; neither is kept
        pop();
        top();
        break;
      }
      case 'Q': {  // BINPERSID: ('storage', storage type, key, location, numel)
        PickleValue id = pop();
        if (id.kind != Kind::tuple || id.items->size() < 5) fail("unknown persistent id");
        auto& parts = *id.items;
        if (parts[0].kind != Kind::string || parts[0].text != "storage" || parts[1].kind != Kind::global ||
            parts[2].kind != Kind::string || parts[4].kind != Kind::integer) {
          fail("unknown persistent id");
        }
        const auto dtype = storage_dtype(parts[1].text);
        if (!dtype) fail(str("unsupported storage type ", parts[1].text));
        PickleValue storage = PickleValue::of(Kind::tensor);
        storage.tensor = load_storage_(parts[2].text, *dtype, parts[4].integer);
        stack_.push_back(std::move(storage));
        break;
      }
      default:
        fail(str("unsupported pickle opcode 0x", std::hex, static_cast<int>(opcode),
                 " (is this a state dict saved with torch.save?)"));
    }
  }

  std::vector<int64_t> integers(const PickleValue& value, const char* what) {
    if (value.kind != Kind::tuple && value.kind != Kind::list) fail(str("expected a tuple for ", what));
    std::vector<int64_t> result;
    for (const auto& item : *value.items) {
      if (item.kind != Kind::integer) fail(str("expected integers in ", what));
      result.push_back(item.integer);
    }
    return result;
  }

  PickleValue call(const std::string& callable, std::vector<PickleValue>& arguments) {
    if (callable == "collections.OrderedDict") return PickleValue::of(Kind::dict);
    if (callable == "torch._utils._rebuild_tensor_v2") {
      // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
      if (arguments.size() < 4 || arguments[0].kind != Kind::tensor || arguments[1].kind != Kind::integer) {
        fail("bad arguments to _rebuild_tensor_v2");
      }
      const torch::Tensor& storage = arguments[0].tensor;
      const int64_t offset = arguments[1].integer;
      const std::vector<int64_t> sizes = integers(arguments[2], "tensor sizes");
      const std::vector<int64_t> strides = integers(arguments[3], "tensor strides");
      if (sizes.size() != strides.size()) fail("tensor sizes and strides differ in length");
      int64_t last = offset;  // the highest element index the tensor reaches
      bool empty = false;
      bool overflow = false;  // sizes and strides of a corrupt file can overflow int64
      for (size_t d = 0; d < sizes.size(); ++d) {
        if (sizes[d] < 0 || strides[d] < 0) fail("negative tensor size or stride");
        if (sizes[d] == 0) empty = true;
        int64_t extent = 0;
        overflow = overflow || __builtin_mul_overflow(sizes[d] - 1, strides[d], &extent) ||
                   __builtin_add_overflow(last, extent, &last);
      }
      if (offset < 0 || (!empty && (overflow || last >= storage.numel()))) {
        fail(str("tensor of sizes ", join(sizes, "x"), " at offset ", offset,
                 " runs past its storage of ", storage.numel(), " elements"));
      }
      PickleValue tensor = PickleValue::of(Kind::tensor);
      tensor.tensor = storage.as_strided(sizes, strides, offset);
      return tensor;
    }
    if (callable == "torch._utils._rebuild_parameter" ||
        callable == "torch._utils._rebuild_parameter_with_state") {
      if (arguments.empty() || arguments[0].kind != Kind::tensor) fail("bad arguments to _rebuild_parameter");
      return arguments[0];
    }
    fail(str("the file holds a Python object of type ", callable,
             ", not just tensors: only state dicts (name -> tensor) can be read"));
  }

  std::string file_;
  const char* data_;
  size_t size_;
  size_t position_ = 0;
  StorageLoader load_storage_;
  std::vector<PickleValue> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, PickleValue> memo_;
  size_t cycle_check_budget_ = 10'000'000;
};

std::string first_line(std::string message) {
  const auto newline = message.find('\n');
  if (newline != std::string::npos) message.resize(newline);
  return message;
}

// The first sentence of a c10::Error, on one line, without LibTorch's long hints and backtrace.
std::string short_reason(const c10::Error& error) {
  std::string message = error.what_without_backtrace();
  const auto end = message.find(". ");
  if (end != std::string::npos) message.resize(end);
  return first_line(message);
}

StateDict read_state_dict(const fs::path& file, const std::optional<torch::Device>& map_location) {
  std::error_code error;
  const auto size = fs::file_size(file, error);
  if (error) throw IoError(str(file.string(), ": cannot read the state dict: ", error.message()));
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
    StorageLoader load_storage = [&](const std::string& key, torch::ScalarType dtype, int64_t numel) {
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
    StateDictUnpickler unpickler(file.string(), static_cast<const char*>(pickle.get()), pickle_size,
                                 load_storage);
    const PickleValue root = unpickler.run();
    if (root.kind != PickleValue::Kind::dict) {
      throw IoError(str(file.string(), ": holds no dict: a state dict (name -> tensor) was expected"));
    }
    StateDict state;
    for (const auto& [key, value] : *root.entries) {
      if (key.kind != PickleValue::Kind::string || value.kind != PickleValue::Kind::tensor) {
        throw IoError(str(file.string(), ": entry ", key.kind == PickleValue::Kind::string ? key.text : "?",
                          " is not a tensor by name: a state dict (name -> tensor) was expected"));
      }
      state.insert(key.text, map_location ? value.tensor.to(*map_location) : value.tensor);
    }
    return state;
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw IoError(str(file.string(), ": truncated or corrupt: ", short_reason(e)));
  } catch (const std::exception& e) {  // e.g. std::bad_alloc for sizes from a corrupt file
    throw IoError(str(file.string(), ": truncated or corrupt: ", first_line(e.what())));
  }
}

// ---- Manifest -------------------------------------------------------------------------------------------

struct ManifestFile {
  std::string name;
  FileDigest digest;
};

struct Manifest {
  CheckpointInfo info;
  std::vector<ManifestFile> files;
};

std::string format_manifest(const CheckpointInfo& info, const std::vector<ManifestFile>& files) {
  std::ostringstream out;
  out << kManifestHeader << "\nepoch " << info.epoch << "\nstep " << info.step << "\nworld_size "
      << info.world_size << "\n";
  for (const auto& file : files) {
    out << "file " << file.name << " " << file.digest.size << " " << hex(file.digest.checksum) << "\n";
  }
  return out.str();
}

Manifest read_manifest(const fs::path& checkpoint) {
  const fs::path path = checkpoint / kManifest;
  std::ifstream in(path);
  if (!in) throw IoError(str(path.string(), ": missing: the checkpoint is incomplete"));
  Manifest manifest;
  manifest.info.path = checkpoint;
  std::string line;
  if (!std::getline(in, line) || line != kManifestHeader) {
    throw IoError(str(path.string(), ": first line is not '", kManifestHeader, "': corrupt or not a checkpoint"));
  }
  for (int number = 2; std::getline(in, line); ++number) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    bool ok = true;
    if (key == "epoch") {
      ok = static_cast<bool>(fields >> manifest.info.epoch);
    } else if (key == "step") {
      ok = static_cast<bool>(fields >> manifest.info.step);
    } else if (key == "world_size") {
      ok = static_cast<bool>(fields >> manifest.info.world_size);
    } else if (key == "file") {
      ManifestFile file;
      std::string checksum;
      ok = static_cast<bool>(fields >> file.name >> file.digest.size >> checksum) && checksum.size() == 16;
      if (ok) {
        try {
          file.digest.checksum = std::stoull(checksum, nullptr, 16);
        } catch (const std::exception&) {
          ok = false;
        }
      }
      // Names are files in the checkpoint folder: "../x" or "/x" would read files elsewhere.
      if (ok && (file.name.find('/') != std::string::npos || file.name == "." || file.name == "..")) {
        throw IoError(str(path.string(), ": line ", number, ": '", file.name,
                          "' is not a plain file name: corrupt MANIFEST"));
      }
      manifest.files.push_back(file);
    }
    if (!ok) throw IoError(str(path.string(), ": line ", number, " is malformed: '", line, "'"));
  }
  return manifest;
}

// ---- Training state (trainer.pt) ----------------------------------------------------------------------

void write_int(torch::serialize::OutputArchive& archive, const std::string& key, int64_t value) {
  archive.write(key, torch::tensor(value, torch::kInt64), /*is_buffer=*/true);
}

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key, const fs::path& file) {
  torch::Tensor value;
  if (!archive.try_read(key, value) || value.numel() != 1) {
    throw IoError(str(file.string(), ": entry '", key, "' is missing"));
  }
  return value.item<int64_t>();
}

void write_trainer_state(const torch::optim::Optimizer* optimizer, const TrainingProgress& progress,
                         bool with_rng, const ByteSink& sink) {
  torch::serialize::OutputArchive archive;
  write_int(archive, "epoch", progress.epoch);
  write_int(archive, "step", progress.step);
  write_int(archive, "sampler_epoch", progress.sampler.epoch);
  write_int(archive, "sampler_position", progress.sampler.position);
  write_int(archive, "sampler_num_replicas", progress.sampler.num_replicas);
  if (optimizer != nullptr) {
    torch::serialize::OutputArchive optimizer_archive;
    optimizer->save(optimizer_archive);
    archive.write("optimizer", optimizer_archive);
  }
  if (with_rng) {
    const RngState rng = get_rng_state();
    archive.write("rng_cpu", rng.cpu, /*is_buffer=*/true);
    write_int(archive, "rng_cuda_count", static_cast<int64_t>(rng.cuda.size()));
    for (size_t i = 0; i < rng.cuda.size(); ++i) archive.write(str("rng_cuda_", i), rng.cuda[i], true);
  }
  archive.save_to([&sink](const void* data, size_t size) {
    sink(data, size);
    return size;
  });
}

TrainingProgress read_trainer_state(const fs::path& file, torch::optim::Optimizer* optimizer,
                                    const torch::Device& device, bool restore_rng) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(file.string(), device);
    TrainingProgress progress;
    progress.epoch = read_int(archive, "epoch", file);
    progress.step = read_int(archive, "step", file);
    progress.sampler.epoch = read_int(archive, "sampler_epoch", file);
    progress.sampler.position = read_int(archive, "sampler_position", file);
    progress.sampler.num_replicas = read_int(archive, "sampler_num_replicas", file);
    if (optimizer != nullptr) {
      torch::serialize::InputArchive optimizer_archive;
      if (!archive.try_read("optimizer", optimizer_archive)) {
        throw IoError(str(file.string(), ": holds no optimizer state (it was saved without an optimizer)"));
      }
      optimizer->load(optimizer_archive);
    }
    torch::Tensor cpu;
    if (restore_rng && archive.try_read("rng_cpu", cpu)) {
      RngState rng;
      rng.cpu = cpu.to(torch::kCPU);
      const int64_t cuda_count = read_int(archive, "rng_cuda_count", file);
      for (int64_t i = 0; i < cuda_count; ++i) {
        torch::Tensor state;
        archive.read(str("rng_cuda_", i), state);
        rng.cuda.push_back(state.to(torch::kCPU));
      }
      set_rng_state(rng);
    }
    return progress;
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw IoError(str(file.string(), ": cannot load the training state: ", short_reason(e)));
  } catch (const std::exception& e) {
    throw IoError(str(file.string(), ": cannot load the training state: ", first_line(e.what())));
  }
}

bool is_checkpoint_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  return name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

}  // namespace

// ---- State dicts -------------------------------------------------------------------------------------

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
    if (const torch::Tensor* value = source.find(item.key())) {
      torch::Tensor destination = item.value();  // detached alias of the parameter or buffer
      destination.copy_(*value);
    }
  }
}

void save_state_dict(const StateDict& state, const fs::path& file) {
  const fs::path directory = file.has_parent_path() ? file.parent_path() : fs::path(".");
  const fs::path temporary = directory / temporary_name("tmp", file.filename().string());
  try {
    OutputFile out(temporary);
    write_state_dict(state, [&out](const void* data, size_t size) { out.write(data, size); });
    out.commit();
    rename_or_throw(temporary, file);
    fsync_directory(directory);
  } catch (...) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw;
  }
}

StateDict load_state_dict_file(const fs::path& file, std::optional<torch::Device> map_location) {
  return strip_prefix(read_state_dict(file, map_location));
}

// ---- RNG state -------------------------------------------------------------------------------------------

RngState get_rng_state() {
  RngState state;
  {
    auto generator = at::globalContext().defaultGenerator(torch::kCPU);
    std::lock_guard<std::mutex> lock(generator.mutex());
    state.cpu = generator.get_state();
  }
  if (torch::cuda::is_available()) {
    const auto devices = static_cast<size_t>(torch::cuda::device_count());
    for (size_t i = 0; i < devices; ++i) {
      auto generator = at::globalContext().defaultGenerator(
          torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
      std::lock_guard<std::mutex> lock(generator.mutex());
      state.cuda.push_back(generator.get_state());
    }
  }
  return state;
}

void set_rng_state(const RngState& state) {
  if (state.cpu.defined()) {
    auto generator = at::globalContext().defaultGenerator(torch::kCPU);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state.cpu);
  }
  const auto devices = torch::cuda::is_available() ? static_cast<size_t>(torch::cuda::device_count()) : 0;
  for (size_t i = 0; i < state.cuda.size() && i < devices; ++i) {
    auto generator = at::globalContext().defaultGenerator(
        torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state.cuda[i]);
  }
}

// ---- Checkpoint folders ------------------------------------------------------------------------------------

std::string checkpoint_name(int64_t step) {
  DDP_CHECK_GE(step, 0, "checkpoint steps are counted from 0");
  std::ostringstream out;
  out << "step-";
  out.width(12);
  out.fill('0');
  out << step;
  return out.str();
}

fs::path write_checkpoint_directory(const fs::path& root, const std::string& name,
                                    const std::vector<CheckpointFile>& files,
                                    const CheckpointInfo& info) {
  std::error_code error;
  fs::create_directories(root, error);
  if (error) throw IoError(str("cannot create the checkpoint folder ", root.string(), ": ", error.message()));
  const fs::path temporary = root / temporary_name("tmp", name);
  const fs::path final_path = root / name;
  try {
    if (!fs::create_directory(temporary, error)) {
      throw IoError(str("cannot create ", temporary.string(), ": ", error ? error.message() : "it exists"));
    }
    std::vector<ManifestFile> written;
    for (const auto& file : files) {
      OutputFile out(temporary / file.name);
      file.write([&out](const void* data, size_t size) { out.write(data, size); });
      out.commit();
      written.push_back({file.name, {out.size(), out.digest()}});
    }
    const std::string manifest = format_manifest(info, written);
    OutputFile out(temporary / kManifest);
    out.write(manifest.data(), manifest.size());
    out.commit();
    fsync_directory(temporary);
    if (fs::exists(final_path)) {
      // Same step saved again: move the old one aside first (rename cannot replace a folder).
      const fs::path old = root / temporary_name("old", name);
      rename_or_throw(final_path, old);
      rename_or_throw(temporary, final_path);
      fs::remove_all(old, error);
    } else {
      rename_or_throw(temporary, final_path);
    }
    fsync_directory(root);
  } catch (...) {
    fs::remove_all(temporary, error);
    throw;
  }
  return final_path;
}

fs::path save_checkpoint(const fs::path& root, const torch::nn::Module& model,
                         const torch::optim::Optimizer* optimizer, const TrainingProgress& progress,
                         int rank, const std::function<void()>& barrier,
                         const CheckpointOptions& options) {
  const std::string name = checkpoint_name(progress.step);
  std::exception_ptr failure;
  if (rank == 0) {
    try {
      const StateDict model_state = state_dict(model);
      const std::vector<CheckpointFile> files = {
          {kModelFile, [&](const ByteSink& sink) { write_state_dict(model_state, sink); }},
          {kTrainerFile,
           [&](const ByteSink& sink) {
             write_trainer_state(optimizer, progress, options.rng_state(), sink);
           }}};
      write_checkpoint_directory(root, name, files,
                                 {root / name, progress.epoch, progress.step, options.world_size()});
      if (options.keep_last() > 0) prune_checkpoints(root, options.keep_last());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (barrier) {
    try {
      barrier();
    } catch (...) {
      if (!failure) throw;  // rank 0's own error says more than the barrier's
    }
  }
  if (failure) std::rethrow_exception(failure);
  return root / name;
}

fs::path save_checkpoint(const fs::path& root, const torch::nn::Module& model,
                         const torch::optim::Optimizer* optimizer, const TrainingProgress& progress,
                         ProcessGroup& group, CheckpointOptions options) {
  options.world_size(group.size());
  fs::path path;
  // Rank 0 writes; the others wait for its "ok" (or its error) and then do nothing.
  main_process_first(group, [&] {
    path = save_checkpoint(root, model, optimizer, progress, group.rank(), nullptr, options);
  });
  return path;
}

namespace {

// verify_checkpoint(), returning the whole MANIFEST.
Manifest verify_manifest_and_files(const fs::path& checkpoint) {
  Manifest manifest = read_manifest(checkpoint);
  for (const auto& file : manifest.files) {
    const fs::path path = checkpoint / file.name;
    std::error_code error;
    const auto size = fs::file_size(path, error);
    if (error) throw IoError(str(path.string(), ": listed in the MANIFEST but unreadable: ", error.message()));
    if (size != file.digest.size) {
      throw IoError(str(path.string(), ": ", size, " bytes, the MANIFEST says ", file.digest.size,
                        size < file.digest.size ? ": the file is truncated" : ": the file was changed"));
    }
    if (digest_file(path).checksum != file.digest.checksum) {
      throw IoError(str(path.string(), ": checksum mismatch: the file is corrupt"));
    }
  }
  return manifest;
}

}  // namespace

CheckpointInfo verify_checkpoint(const fs::path& checkpoint) {
  return verify_manifest_and_files(checkpoint).info;
}

TrainingProgress load_checkpoint(const fs::path& checkpoint, torch::nn::Module& model,
                                 torch::optim::Optimizer* optimizer, const CheckpointOptions& options) {
  const Manifest manifest = verify_manifest_and_files(checkpoint);
  // Unlisted files would be read unchecked.
  for (const char* name : {kModelFile, kTrainerFile}) {
    const bool listed = std::any_of(manifest.files.begin(), manifest.files.end(),
                                    [name](const ManifestFile& file) { return file.name == name; });
    if (!listed) {
      throw IoError(str((checkpoint / kManifest).string(), ": does not list ", name,
                        ": corrupt MANIFEST, or not a checkpoint written by save_checkpoint"));
    }
  }
  load_state_dict(model, load_state_dict_file(checkpoint / kModelFile), options.strict());
  torch::Device device = torch::kCPU;
  if (options.map_location()) {
    device = *options.map_location();
  } else {
    const auto parameters = model.parameters();
    if (!parameters.empty()) device = parameters.front().device();
  }
  return read_trainer_state(checkpoint / kTrainerFile, optimizer, device, options.rng_state());
}

std::vector<CheckpointInfo> list_checkpoints(const fs::path& root) {
  std::vector<CheckpointInfo> result;
  std::error_code error;
  if (!fs::is_directory(root, error)) return result;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (!is_checkpoint_name(name) || !fs::is_regular_file(entry.path() / kManifest)) continue;
    CheckpointInfo info;
    try {
      info = read_manifest(entry.path()).info;
    } catch (const IoError&) {
      // Listed anyway (the name says which step); verify_checkpoint() reports what is wrong.
      info.path = entry.path();
      try {
        info.step = std::stoll(name.substr(5));
      } catch (const std::out_of_range&) {
        continue;  // more digits than any step: not ours
      }
    }
    result.push_back(info);
  }
  std::sort(result.begin(), result.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step > b.step; });
  return result;
}

std::optional<CheckpointInfo> find_latest_valid_checkpoint(const fs::path& root) {
  for (const auto& candidate : list_checkpoints(root)) {
    try {
      return verify_checkpoint(candidate.path);
    } catch (const IoError& e) {
      Logger("checkpoint").warn(str("skipping checkpoint ", candidate.path.string(), ": ", e.what()));
    }
  }
  return std::nullopt;
}

void prune_checkpoints(const fs::path& root, int keep_last) {
  DDP_CHECK_GE(keep_last, 0, "keep_last counts checkpoints to keep; 0 keeps all");
  std::error_code error;
  const auto checkpoints = list_checkpoints(root);
  for (size_t i = static_cast<size_t>(keep_last); keep_last > 0 && i < checkpoints.size(); ++i) {
    fs::remove_all(checkpoints[i].path, error);
  }
  if (!fs::is_directory(root, error)) return;
  std::vector<fs::path> leftovers;  // temporary folders of writers that died
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-step-", 0) == 0 || name.rfind(".old-step-", 0) == 0) leftovers.push_back(entry.path());
  }
  for (const auto& path : leftovers) fs::remove_all(path, error);
}

}  // namespace ddp
