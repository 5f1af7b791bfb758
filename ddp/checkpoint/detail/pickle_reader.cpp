#include "ddp/checkpoint/detail/pickle_reader.h"

#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ddp/base/error.h"
#include "ddp/base/str.h"

namespace ddp::detail {

// See Note [Reading PyTorch pickles] in pickle_reader.h.

PickleValue PickleValue::of(Kind kind) {
  PickleValue value;
  value.kind = kind;
  if (kind == Kind::kTuple || kind == Kind::kList) {
    value.items = std::make_shared<std::vector<PickleValue>>();
  }
  if (kind == Kind::kDict) {
    value.entries = std::make_shared<std::vector<std::pair<PickleValue, PickleValue>>>();
  }
  return value;
}

const PickleValue* PickleValue::find(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [name, value] : *entries) {
    if (name.kind == Kind::kString && name.text == key) return &value;
  }
  return nullptr;
}

// Note [Deep pickles]
// ~~~~~~~~~~~~~~~~~~~
// A pickle of n bytes can nest lists n/2 deep; the implicit destructor would recurse once per
// level and overflow the stack (tests/fuzz/regressions/checkpoint/pickle-deep-nesting). Children
// of containers whose last owner this is are moved to a work list instead and destroyed one at a
// time, their own children already moved out.
void PickleValue::release_children() {
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

namespace {

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

class PickleUnpickler {
 public:
  PickleUnpickler(std::string file, std::string what, const char* data, size_t size,
                  const StorageLoader& load_storage)
      : file_(std::move(file)), what_(std::move(what)), data_(data), size_(size), load_storage_(load_storage) {}

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
    throw IoError(str(file_, ": not a readable ", what_, ": ", what, " (byte ", position_,
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
    PickleValue tuple = PickleValue::of(Kind::kTuple);
    *tuple.items = std::move(values);
    stack_.push_back(std::move(tuple));
  }
  void push_string(size_t length) {
    PickleValue value = PickleValue::of(Kind::kString);
    value.text.assign(read(length), length);
    stack_.push_back(std::move(value));
  }
  void push_integer(int64_t integer) {
    PickleValue value = PickleValue::of(Kind::kInteger);
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
    expect(dict, Kind::kDict, "a dict for SETITEMS");
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
      case 'N': stack_.push_back(PickleValue::of(Kind::kNone)); break;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        PickleValue value = PickleValue::of(Kind::kBoolean);
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
        PickleValue value = PickleValue::of(Kind::kReal);
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
        PickleValue value = PickleValue::of(Kind::kGlobal);
        value.text = module + "." + name;
        stack_.push_back(std::move(value));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        PickleValue name = pop();
        PickleValue module = pop();
        if (name.kind != Kind::kString || module.kind != Kind::kString) fail("STACK_GLOBAL needs strings");
        PickleValue value = PickleValue::of(Kind::kGlobal);
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
      case ']': stack_.push_back(PickleValue::of(Kind::kList)); break;
      case 'l': {  // LIST
        PickleValue list = PickleValue::of(Kind::kList);
        *list.items = pop_to_mark();
        stack_.push_back(std::move(list));
        break;
      }
      case 'a': {  // APPEND
        PickleValue value = pop();
        PickleValue& list = expect(top(), Kind::kList, "a list for APPEND");
        refuse_cycle(list, value);
        list.items->push_back(std::move(value));
        break;
      }
      case 'e': {  // APPENDS
        std::vector<PickleValue> values = pop_to_mark();
        PickleValue& list = expect(top(), Kind::kList, "a list for APPENDS");
        for (const auto& value : values) refuse_cycle(list, value);
        for (auto& value : values) list.items->push_back(std::move(value));
        break;
      }
      case '}': stack_.push_back(PickleValue::of(Kind::kDict)); break;  // EMPTY_DICT
      case 'd': {  // DICT
        std::vector<PickleValue> flat = pop_to_mark();
        PickleValue dict = PickleValue::of(Kind::kDict);
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
        if (callable.kind != Kind::kGlobal || arguments.kind != Kind::kTuple) fail("REDUCE needs a global and a tuple");
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
        if (id.kind != Kind::kTuple || id.items->size() < 5) fail("unknown persistent id");
        auto& parts = *id.items;
        if (parts[0].kind != Kind::kString || parts[0].text != "storage" || parts[1].kind != Kind::kGlobal ||
            parts[2].kind != Kind::kString || parts[4].kind != Kind::kInteger) {
          fail("unknown persistent id");
        }
        const auto dtype = storage_dtype(parts[1].text);
        if (!dtype) fail(str("unsupported storage type ", parts[1].text));
        PickleValue storage = PickleValue::of(Kind::kTensor);
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
    if (value.kind != Kind::kTuple && value.kind != Kind::kList) fail(str("expected a tuple for ", what));
    std::vector<int64_t> result;
    for (const auto& item : *value.items) {
      if (item.kind != Kind::kInteger) fail(str("expected integers in ", what));
      result.push_back(item.integer);
    }
    return result;
  }

  PickleValue call(const std::string& callable, std::vector<PickleValue>& arguments) {
    if (callable == "collections.OrderedDict") return PickleValue::of(Kind::kDict);
    if (callable == "torch._utils._rebuild_tensor_v2") {
      // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
      if (arguments.size() < 4 || arguments[0].kind != Kind::kTensor || arguments[1].kind != Kind::kInteger) {
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
      PickleValue tensor = PickleValue::of(Kind::kTensor);
      tensor.tensor = storage.as_strided(sizes, strides, offset);
      return tensor;
    }
    if (callable == "torch._utils._rebuild_parameter" ||
        callable == "torch._utils._rebuild_parameter_with_state") {
      if (arguments.empty() || arguments[0].kind != Kind::kTensor) fail("bad arguments to _rebuild_parameter");
      return arguments[0];
    }
    const bool torchscript = callable.rfind("__torch__.", 0) == 0;
    fail(str("the file holds a Python object of type ", callable,
             torchscript ? " (a TorchScript archive, which is never loaded: it could run code)" : "",
             "; refused, nothing was called: only dicts, lists, numbers, strings and tensors are read"));
  }

  std::string file_;
  std::string what_;
  const char* data_;
  size_t size_;
  size_t position_ = 0;
  const StorageLoader& load_storage_;
  std::vector<PickleValue> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, PickleValue> memo_;
  size_t cycle_check_budget_ = 10'000'000;
};

}  // namespace

PickleValue read_pickle(const std::string& file, const std::string& what, const char* data, size_t size,
                        const StorageLoader& load_storage) {
  return PickleUnpickler(file, what, data, size, load_storage).run();
}

}  // namespace ddp::detail
