// The Fashion-MNIST and CIFAR-10 readers on the real files and on broken ones made here.
#include <zlib.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ddp/base/error.h"
#include "tests/support/temp_dir.h"
#include "examples/data/cifar10.h"
#include "examples/data/fashion_mnist.h"
#include "examples/data/idx.h"

namespace fs = std::filesystem;
using ddp::testing::TempDir;
using namespace ddp::examples::data;
using Catch::Matchers::Contains;

namespace {

void write_bytes(const fs::path& file, const std::vector<uint8_t>& bytes) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_gzip(const fs::path& file, const std::vector<uint8_t>& bytes) {
  gzFile out = gzopen(file.c_str(), "wb");
  REQUIRE(out != nullptr);
  REQUIRE(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(out) == Z_OK);
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(v >> shift));
}

std::vector<uint8_t> idx(std::vector<uint32_t> dims, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out{0, 0, 8, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_u32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// A small valid Fashion-MNIST folder: n images of 28x28 whose pixels are (image + pixel) % 256.
void write_small_fashion_mnist(const fs::path& dir, uint32_t n, bool gzip) {
  std::vector<uint8_t> pixels, labels;
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t p = 0; p < 28 * 28; ++p) pixels.push_back(static_cast<uint8_t>((i + p) % 256));
    labels.push_back(static_cast<uint8_t>(i % 10));
  }
  for (const char* prefix : {"train", "t10k"}) {
    const std::string images = std::string(prefix) + "-images-idx3-ubyte";
    const std::string label_file = std::string(prefix) + "-labels-idx1-ubyte";
    if (gzip) {
      write_gzip(dir / (images + ".gz"), idx({n, 28, 28}, pixels));
      write_gzip(dir / (label_file + ".gz"), idx({n}, labels));
    } else {
      write_bytes(dir / images, idx({n, 28, 28}, pixels));
      write_bytes(dir / label_file, idx({n}, labels));
    }
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::IoError& e) {
    return e.what();
  }
  FAIL("no ddp::IoError thrown");
  return "";
}

}  // namespace

TEST_CASE("the real Fashion-MNIST files read as 60000 + 10000 labelled 28x28 images", "[readers]") {
  if (!fs::exists(std::string(kFashionMnistDefaultDir) + "/train-images-idx3-ubyte.gz")) {
    FAIL("Debian's dataset-fashion-mnist is not installed: run scripts/setup.sh");
  }
  const ImageSet train = load_fashion_mnist(kFashionMnistDefaultDir, Split::kTrain);
  const ImageSet test = load_fashion_mnist(kFashionMnistDefaultDir, Split::kTest);
  CHECK(train.count == 60000);
  CHECK(test.count == 10000);
  CHECK(train.channels == 1);
  CHECK(train.height == 28);
  CHECK(train.width == 28);
  CHECK(train.pixels.size() == size_t{60000} * 784);
  // Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
  std::map<int, int> per_class;
  for (uint8_t label : train.labels) ++per_class[label];
  REQUIRE(per_class.size() == 10);
  for (const auto& [label, n] : per_class) CHECK(n == 6000);
  // The published first training label is 9 (ankle boot); the mean pixel is about 0.286 * 255.
  CHECK(train.labels[0] == 9);
  double sum = 0;
  for (uint8_t p : train.pixels) sum += p;
  CHECK(sum / static_cast<double>(train.pixels.size()) / 255.0 == Approx(0.2860).margin(0.001));
}

TEST_CASE("plain and gzip IDX files read the same", "[readers]") {
  TempDir plain, gz;
  write_small_fashion_mnist(plain.path, 20, false);
  write_small_fashion_mnist(gz.path, 20, true);
  const ImageSet a = load_fashion_mnist(plain.path.string(), Split::kTrain);
  const ImageSet b = load_fashion_mnist(gz.path.string(), Split::kTest);
  CHECK(a.count == 20);
  CHECK(a.pixels == b.pixels);
  CHECK(a.labels == b.labels);
  CHECK(a.pixels[784 * 3 + 5] == 8);
  CHECK(a.labels[13] == 3);
}

TEST_CASE("broken Fashion-MNIST files give an error naming the file and the problem", "[readers]") {
  TempDir dir;
  write_small_fashion_mnist(dir.path, 10, false);
  const std::string images = (dir.path / "train-images-idx3-ubyte").string();
  const std::string labels = (dir.path / "train-labels-idx1-ubyte").string();
  const auto load = [&] { load_fashion_mnist(dir.path.string(), Split::kTrain); };

  SECTION("missing") {
    fs::remove(labels);
    const std::string e = error_of(load);
    CHECK_THAT(e, Contains(labels) && Contains("missing") && Contains("--data-dir"));
  }
  SECTION("wrong magic number") {
    std::vector<uint8_t> bytes = idx({10, 28, 28}, std::vector<uint8_t>(7840));
    bytes[2] = 0x0d;  // float data instead of unsigned bytes
    write_bytes(images, bytes);
    const std::string e = error_of(load);
    CHECK_THAT(e, Contains(images) && Contains("wrong magic number 0x00000d03") && Contains("0x00000803"));
  }
  SECTION("labels file given where images are expected (wrong rank)") {
    fs::copy_file(labels, images, fs::copy_options::overwrite_existing);
    CHECK_THAT(error_of(load), Contains(images) && Contains("wrong magic number"));
  }
  SECTION("truncated plain file") {
    write_bytes(images, idx({10, 28, 28}, std::vector<uint8_t>(7840 - 100)));
    CHECK_THAT(error_of(load), Contains(images) && Contains("truncated") && Contains("7840"));
  }
  SECTION("truncated gzip stream") {
    TempDir whole;
    write_gzip(whole.path / "x.gz", idx({10, 28, 28}, std::vector<uint8_t>(7840, 7)));
    std::ifstream in(whole.path / "x.gz", std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.resize(bytes.size() / 2);
    fs::remove(images);
    write_bytes(images + ".gz", bytes);
    CHECK_THAT(error_of(load), Contains(images + ".gz") && Contains("truncated"));
  }
  SECTION("label out of range") {
    std::vector<uint8_t> values(10, 1);
    values[7] = 10;
    write_bytes(labels, idx({10}, values));
    CHECK_THAT(error_of(load), Contains(labels) && Contains("label 10 of record 7 is out of range 0..9"));
  }
  SECTION("no images, or images of no pixels") {
    write_bytes(images, idx({0, 28, 28}, {}));
    write_bytes(labels, idx({0}, {}));
    CHECK_THAT(error_of(load), Contains(images) && Contains("holds no pixels (0 x 28 x 28 images)"));
    write_bytes(images, idx({10, 0, 28}, {}));
    write_bytes(labels, idx({10}, std::vector<uint8_t>(10, 1)));
    CHECK_THAT(error_of(load), Contains(images) && Contains("holds no pixels (10 x 0 x 28 images)"));
  }
  SECTION("dimensions whose product overflows: rejected, not taken for an empty file") {
    // 2^22 * 2^21 * 2^21 = 2^64 wraps to 0 in size_t; the fuzz test's regression input.
    write_bytes(images, idx({1u << 22, 1u << 21, 1u << 21}, {}));
    CHECK_THAT(error_of(load), Contains(images) && Contains("more than any file holds"));
  }
  SECTION("images and labels disagree in number") {
    write_bytes(labels, idx({9}, std::vector<uint8_t>(9, 1)));
    CHECK_THAT(error_of(load), Contains(labels) && Contains("9 labels") && Contains("10 images"));
  }
}

TEST_CASE("the CIFAR-10 reader reads records of 1 label and 3072 CHW pixel bytes", "[readers]") {
  TempDir dir;
  // Batch f holds 3 records; record r of batch f has label (f + r) % 10 and pixel p = (f * 7 + r + p) % 251.
  const auto record = [](int f, int r) {
    std::vector<uint8_t> out{static_cast<uint8_t>((f + r) % 10)};
    for (int p = 0; p < 3072; ++p) out.push_back(static_cast<uint8_t>((f * 7 + r + p) % 251));
    return out;
  };
  const std::vector<std::string> names = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                          "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
  for (int f = 0; f < 6; ++f) {
    std::vector<uint8_t> bytes;
    for (int r = 0; r < 3; ++r) {
      const auto rec = record(f, r);
      bytes.insert(bytes.end(), rec.begin(), rec.end());
    }
    write_bytes(dir.path / names[static_cast<size_t>(f)], bytes);
  }
  CHECK(cifar10_files(Split::kTrain) == std::vector<std::string>(names.begin(), names.begin() + 5));

  const ImageSet train = load_cifar10(dir.path.string(), Split::kTrain);
  REQUIRE(train.count == 15);
  CHECK(train.channels == 3);
  CHECK(train.height == 32);
  CHECK(train.width == 32);
  for (int i = 0; i < 15; ++i) {
    const int f = i / 3, r = i % 3;
    CHECK(train.labels[static_cast<size_t>(i)] == (f + r) % 10);
    // Green channel, row 1, column 2 of image i.
    CHECK(train.pixels[static_cast<size_t>(i) * 3072 + 1024 + 32 + 2] == (f * 7 + r + 1024 + 32 + 2) % 251);
  }
  const ImageSet test = load_cifar10(dir.path.string(), Split::kTest);
  REQUIRE(test.count == 3);
  CHECK(test.labels[1] == 6);

  SECTION("missing file") {
    fs::remove(dir.path / "data_batch_4.bin");
    CHECK_THAT(error_of([&] { load_cifar10(dir.path.string(), Split::kTrain); }),
               Contains((dir.path / "data_batch_4.bin").string()) && Contains("missing"));
  }
  SECTION("truncated file") {
    fs::resize_file(dir.path / "test_batch.bin", 3 * 3073 - 1);
    CHECK_THAT(error_of([&] { load_cifar10(dir.path.string(), Split::kTest); }),
               Contains((dir.path / "test_batch.bin").string()) && Contains("truncated") && Contains("3073"));
  }
  SECTION("label out of range") {
    std::vector<uint8_t> bytes = record(0, 0);
    const auto second = record(0, 1);
    bytes.insert(bytes.end(), second.begin(), second.end());
    bytes[3073] = 200;
    write_bytes(dir.path / "data_batch_2.bin", bytes);
    CHECK_THAT(error_of([&] { load_cifar10(dir.path.string(), Split::kTrain); }),
               Contains("data_batch_2.bin") && Contains("label 200 of record 1 is out of range 0..9"));
  }
}
