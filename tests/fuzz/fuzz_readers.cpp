// Fuzz entries of the IDX and CIFAR-10 readers; see Note [Fuzz inputs] in fuzz_entries.h.
#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "ddp/base/error.h"
#include "examples/data/cifar10.h"
#include "examples/data/idx.h"
#include "tests/fuzz/fuzz_entries.h"

namespace ddp::fuzz {
namespace fs = std::filesystem;
using namespace ddp::examples::data;

namespace {

void check(bool condition, const std::string& what) {
  if (!condition) throw std::logic_error("broken invariant of a parsed input: " + what);
}

// The input's content written as the file `name` in `folder`: as given, or gzip-compressed (mode 1).
fs::path write_input(const uint8_t* data, size_t size, const fs::path& folder, const std::string& name) {
  const bool gzip = size > 0 && (data[0] & 1);
  const uint8_t* content = size > 0 ? data + 1 : data;
  const size_t content_size = size > 0 ? size - 1 : 0;
  fs::create_directories(folder);
  const fs::path file = folder / name;
  if (gzip) {
    write_gzip_file(file, content, content_size);
  } else {
    write_file(file, content, content_size);
  }
  return file;
}

void put_u32(std::vector<uint8_t>& out, uint32_t value) {
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(value >> shift));
}

// An IDX file of unsigned bytes with these dimensions and bytes.
std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims, const uint8_t* data, size_t size) {
  std::vector<uint8_t> out{0, 0, 8, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_u32(out, d);
  out.insert(out.end(), data, data + size);
  return out;
}

// A seed: the mode byte, then the content.
void write_seed(const fs::path& folder, const std::string& name, uint8_t mode, const std::vector<uint8_t>& content) {
  std::vector<uint8_t> input{mode};
  input.insert(input.end(), content.begin(), content.end());
  fs::create_directories(folder);
  write_file(folder / name, input.data(), input.size());
}

}  // namespace

void write_file(const fs::path& file, const uint8_t* data, size_t size) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("fuzz harness: cannot write " + file.string());
}

void write_gzip_file(const fs::path& file, const uint8_t* data, size_t size) {
  gzFile out = gzopen(file.c_str(), "wb");
  if (out == nullptr) throw std::runtime_error("fuzz harness: cannot write " + file.string());
  const int written = size > 0 ? gzwrite(out, data, static_cast<unsigned>(size)) : 0;
  if (gzclose(out) != Z_OK || written != static_cast<int>(size)) {
    throw std::runtime_error("fuzz harness: cannot gzip into " + file.string());
  }
}

std::vector<uint8_t> read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("fuzz harness: cannot read " + file.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const fs::path& process_scratch() {
  // Removed by the destructor at exit; a crash leaves it (scripts/fuzz.sh runs under its own TMPDIR).
  struct Scratch {
    fs::path path;
    Scratch() {
      std::string pattern = (fs::temp_directory_path() / "ddp_fuzz_XXXXXX").string();
      if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("fuzz harness: mkdtemp failed");
      path = pattern;
    }
    ~Scratch() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const Scratch scratch;
  return scratch.path;
}

Outcome rejected(const std::exception& error) {
  const std::string message = error.what();
  if (message.empty() || message.find('\n') != std::string::npos) {
    throw std::logic_error("a ddp::Error's message is not one non-empty line: '" + message + "'");
  }
  return {false, message};
}

Outcome idx_entry(const uint8_t* data, size_t size, const fs::path& scratch) {
  const fs::path file = write_input(data, size, scratch / "idx", "input-idx-ubyte");
  Outcome outcome;
  std::string errors;  // both ranks' errors when neither parses
  for (int rank : {1, 3}) {
    try {
      const IdxArray array = read_idx(file.string(), rank);
      check(array.dims.size() == static_cast<size_t>(rank), "the number of dimensions is the rank");
      size_t elements = 1;
      for (int64_t d : array.dims) {
        check(d >= 0, "dimensions are not negative");
        check(!__builtin_mul_overflow(elements, static_cast<size_t>(d), &elements),
              "the dimensions' product fits in size_t");
      }
      check(elements == array.bytes.size(), "the dimensions multiply to the number of bytes");
      outcome.parsed = true;
    } catch (const ddp::Error& e) {
      errors += (errors.empty() ? "" : " | ") + rejected(e).error;
    }
  }
  if (!outcome.parsed) outcome.error = errors;
  return outcome;
}

Outcome cifar10_entry(const uint8_t* data, size_t size, const fs::path& scratch) {
  write_input(data, size, scratch / "cifar10", cifar10_files(Split::kTest).front());
  try {
    const ImageSet set = load_cifar10((scratch / "cifar10").string(), Split::kTest);
    check(set.count > 0, "a parsed split holds images");
    check(set.image_bytes() == kCifar10RecordBytes - 1, "images are 3x32x32");
    check(set.pixels.size() == static_cast<size_t>(set.count * set.image_bytes()), "pixels fit the count");
    check(set.labels.size() == static_cast<size_t>(set.count), "one label per image");
    for (uint8_t label : set.labels) check(label < kCifar10Classes, "labels are classes");
    return {true, ""};
  } catch (const ddp::Error& e) {
    return rejected(e);
  }
}

void write_reader_seeds(const fs::path& corpus, const std::string& fashion_mnist_dir) {
  // Two real images and eight real labels: small inputs mutate faster.
  const IdxArray images = read_idx((fs::path(fashion_mnist_dir) / "t10k-images-idx3-ubyte.gz").string(), 3);
  const IdxArray labels = read_idx((fs::path(fashion_mnist_dir) / "t10k-labels-idx1-ubyte.gz").string(), 1);
  const std::vector<uint8_t> two_images = idx_bytes({2, 28, 28}, images.bytes.data(), 2 * 28 * 28);
  const std::vector<uint8_t> eight_labels = idx_bytes({8}, labels.bytes.data(), 8);
  const fs::path idx = corpus / "idx";
  write_seed(idx, "images-plain", 0, two_images);
  write_seed(idx, "images-gzip-mode", 1, two_images);
  write_seed(idx, "labels-plain", 0, eight_labels);
  write_seed(idx, "labels-gzip-mode", 1, eight_labels);
  // A real gzip stream as the file itself (mode 0): the reader's gzip detection and zlib's checks.
  const fs::path gz = corpus / "labels.gz.tmp";
  write_gzip_file(gz, eight_labels.data(), eight_labels.size());
  write_seed(idx, "labels-gzip-stream", 0, read_file(gz));
  fs::remove(gz);

  // CIFAR-10 records made of real Fashion-MNIST images (CIFAR-10 is not packaged): the 28x28 image
  // centred in each 32x32 channel, with the image's real label.
  std::vector<uint8_t> records;
  for (int r = 0; r < 2; ++r) {
    records.push_back(labels.bytes[static_cast<size_t>(r)]);
    for (int channel = 0; channel < 3; ++channel) {
      for (int y = 0; y < 32; ++y) {
        for (int x = 0; x < 32; ++x) {
          const bool inside = y >= 2 && y < 30 && x >= 2 && x < 30;
          records.push_back(inside ? images.bytes[static_cast<size_t>(r * 784 + (y - 2) * 28 + (x - 2))] : 0);
        }
      }
    }
  }
  const fs::path cifar = corpus / "cifar10";
  write_seed(cifar, "two-records", 0, records);
  write_seed(cifar, "one-record-gzip-mode", 1,
             std::vector<uint8_t>(records.begin(), records.begin() + kCifar10RecordBytes));
}

}  // namespace ddp::fuzz
