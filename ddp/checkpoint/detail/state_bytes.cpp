#include "ddp/checkpoint/detail/state_bytes.h"

#include <cstring>

#include "ddp/base/error.h"
#include "ddp/base/str.h"

namespace ddp::detail {
namespace {

template <class T>
void append(std::string& bytes, const T& value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof value);
}

constexpr std::int64_t kMaxDims = 64;
constexpr int kMaxDepth = 64;

}  // namespace

void StateWriter::integer(std::int64_t value) { append(bytes_, value); }
void StateWriter::real(double value) { append(bytes_, value); }
void StateWriter::text(const std::string& value) {
  integer(static_cast<std::int64_t>(value.size()));
  bytes_ += value;
}

void StateWriter::tensor(const torch::Tensor& value) {
  const torch::Tensor t = value.detach().contiguous().cpu();
  integer(static_cast<std::int64_t>(t.scalar_type()));
  integer(t.dim());
  for (const std::int64_t size : t.sizes()) integer(size);
  integer(static_cast<std::int64_t>(t.nbytes()));
  bytes_.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

void StateWriter::value(const c10::IValue& value) {
  if (value.isNone()) {
    bytes_ += 'N';
  } else if (value.isBool()) {
    bytes_ += 'B';
    integer(value.toBool() ? 1 : 0);
  } else if (value.isInt()) {
    bytes_ += 'I';
    integer(value.toInt());
  } else if (value.isDouble()) {
    bytes_ += 'D';
    real(value.toDouble());
  } else if (value.isString()) {
    bytes_ += 'S';
    text(value.toStringRef());
  } else if (value.isTensor()) {
    bytes_ += 'T';
    tensor(value.toTensor());
  } else if (value.isTuple() || value.isList()) {
    bytes_ += value.isTuple() ? 'U' : 'L';
    const auto elements = value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec();
    integer(static_cast<std::int64_t>(elements.size()));
    for (const auto& element : elements) this->value(element);
  } else if (value.isGenericDict()) {
    bytes_ += 'M';
    const auto dict = value.toGenericDict();
    integer(static_cast<std::int64_t>(dict.size()));
    for (const auto& entry : dict) {
      this->value(entry.key());
      this->value(entry.value());
    }
  } else {
    throw Error(str("cannot send a value of type ", value.tagKind(), " in the training state"));
  }
}

void StateReader::fail(const std::string& what) const {
  throw CommunicationError(str(origin_, " is malformed at byte ", offset_, ": ", what));
}

const char* StateReader::take(std::size_t size) {
  if (size > bytes_.size() - offset_) fail(str("needs ", size, " more bytes, ", bytes_.size() - offset_, " left"));
  const char* at = bytes_.data() + offset_;
  offset_ += size;
  return at;
}

std::int64_t StateReader::integer() {
  std::int64_t value = 0;
  std::memcpy(&value, take(sizeof value), sizeof value);
  return value;
}

double StateReader::real() {
  double value = 0;
  std::memcpy(&value, take(sizeof value), sizeof value);
  return value;
}

std::string StateReader::text() {
  const std::int64_t size = integer();
  if (size < 0) fail("a negative string length");
  return std::string(take(static_cast<std::size_t>(size)), static_cast<std::size_t>(size));
}

torch::Tensor StateReader::tensor() {
  const std::int64_t dtype = integer();
  if (dtype < 0 || dtype >= static_cast<std::int64_t>(c10::ScalarType::NumOptions)) fail("an unknown dtype");
  const std::int64_t dims = integer();
  if (dims < 0 || dims > kMaxDims) fail(str(dims, " dimensions"));
  std::vector<std::int64_t> sizes;
  for (std::int64_t d = 0; d < dims; ++d) {
    sizes.push_back(integer());
    if (sizes.back() < 0) fail("a negative size");
  }
  const std::int64_t nbytes = integer();
  auto t = torch::empty(sizes, torch::TensorOptions().dtype(static_cast<c10::ScalarType>(dtype)));
  if (nbytes != static_cast<std::int64_t>(t.nbytes())) fail(str(nbytes, " bytes for a tensor of ", t.nbytes()));
  std::memcpy(t.data_ptr(), take(static_cast<std::size_t>(nbytes)), static_cast<std::size_t>(nbytes));
  return t;
}

detail::PickleValue StateReader::value() {
  using Kind = detail::PickleValue::Kind;
  struct Depth {
    int& depth;
    explicit Depth(int& d) : depth(++d) {}
    ~Depth() { --depth; }
  };
  static thread_local int depth = 0;
  Depth guard(depth);
  if (depth > kMaxDepth) fail("values nested too deep");
  const char tag = *take(1);
  detail::PickleValue out;
  switch (tag) {
    case 'N':
      return detail::PickleValue::of(Kind::kNone);
    case 'B':
      out = detail::PickleValue::of(Kind::kBoolean);
      out.integer = integer() != 0 ? 1 : 0;
      return out;
    case 'I':
      out = detail::PickleValue::of(Kind::kInteger);
      out.integer = integer();
      return out;
    case 'D':
      out = detail::PickleValue::of(Kind::kReal);
      out.real = real();
      return out;
    case 'S':
      out = detail::PickleValue::of(Kind::kString);
      out.text = text();
      return out;
    case 'T':
      out = detail::PickleValue::of(Kind::kTensor);
      out.tensor = tensor();
      return out;
    case 'L':
    case 'U': {
      out = detail::PickleValue::of(tag == 'L' ? Kind::kList : Kind::kTuple);
      const std::int64_t count = integer();
      if (count < 0) fail("a negative count");
      for (std::int64_t i = 0; i < count; ++i) out.items->push_back(value());
      return out;
    }
    case 'M': {
      out = detail::PickleValue::of(Kind::kDict);
      const std::int64_t count = integer();
      if (count < 0) fail("a negative count");
      for (std::int64_t i = 0; i < count; ++i) {
        detail::PickleValue key = value();
        out.entries->emplace_back(std::move(key), value());
      }
      return out;
    }
    default:
      fail(str("unknown tag ", static_cast<int>(static_cast<unsigned char>(tag))));
  }
}

std::uint64_t fnv1a64(const std::string& bytes) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace ddp::detail
