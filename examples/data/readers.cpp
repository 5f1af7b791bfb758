// The Fashion-MNIST and CIFAR-10 readers and ImageSet (one translation unit: they share helpers).
#include <algorithm>
#include <filesystem>

#include "ddp/base/error.h"
#include "examples/data/cifar10.h"
#include "examples/data/fashion_mnist.h"
#include "examples/data/idx.h"

namespace ddp::examples::data {
namespace {

const char* split_name(Split split) { return split == Split::kTrain ? "train" : "test"; }

// The gzip file when present, else the plain one; an error naming both when neither exists.
std::string find_idx_file(const std::string& dir, const std::string& stem) {
  const std::filesystem::path base = std::filesystem::path(dir) / stem;
  const std::string gz = base.string() + ".gz";
  if (std::filesystem::exists(gz)) return gz;
  if (std::filesystem::exists(base)) return base.string();
  throw IoError(str(gz, ": missing (nor is there ", base.string(),
                    "): install Debian's dataset-fashion-mnist or pass --data-dir"));
}

void check_labels(const std::vector<uint8_t>& labels, int classes, const std::string& file,
                  int64_t first_index) {
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= classes) {
      throw IoError(str(file, ": label ", int{labels[i]}, " of record ", first_index + int64_t(i),
                        " is out of range 0..", classes - 1));
    }
  }
}

}  // namespace

void ImageSet::truncate(int64_t n) {
  if (n <= 0 || n >= count) return;
  count = n;
  pixels.resize(static_cast<size_t>(n * image_bytes()));
  labels.resize(static_cast<size_t>(n));
}

ImageSet load_fashion_mnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_file = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_file = find_idx_file(dir, prefix + "-labels-idx1-ubyte");
  IdxArray images = read_idx(images_file, 3);
  IdxArray labels = read_idx(labels_file, 1);
  if (images.dims[0] != labels.dims[0]) {
    throw IoError(str(labels_file, ": holds ", labels.dims[0], " labels but ", images_file, " holds ",
                      images.dims[0], " images (", split_name(split), " split)"));
  }
  if (images.dims[0] == 0 || images.dims[1] == 0 || images.dims[2] == 0) {
    throw IoError(str(images_file, ": holds no pixels (", join(images.dims, " x "),
                      " images): download the file again"));
  }
  check_labels(labels.bytes, kFashionMnistClasses, labels_file, 0);
  ImageSet set;
  set.count = images.dims[0];
  set.channels = 1;
  set.height = images.dims[1];
  set.width = images.dims[2];
  set.pixels = std::move(images.bytes);
  set.labels = std::move(labels.bytes);
  return set;
}

std::vector<std::string> cifar10_files(Split split) {
  if (split == Split::kTest) return {"test_batch.bin"};
  std::vector<std::string> files;
  for (int i = 1; i <= 5; ++i) files.push_back(str("data_batch_", i, ".bin"));
  return files;
}

ImageSet load_cifar10(const std::string& dir, Split split) {
  ImageSet set;
  set.channels = 3;
  set.height = 32;
  set.width = 32;
  for (const std::string& name : cifar10_files(split)) {
    const std::string file = (std::filesystem::path(dir) / name).string();
    if (!std::filesystem::exists(file)) {
      throw IoError(str(file, ": missing: pass --data-dir with the folder of CIFAR-10's binary version ",
                        "(cifar-10-batches-bin)"));
    }
    const std::vector<uint8_t> bytes = read_maybe_gzip(file);
    const auto size = static_cast<int64_t>(bytes.size());
    if (size == 0 || size % kCifar10RecordBytes != 0) {
      throw IoError(str(file, ": ", size == 0 ? "empty" : "truncated", ": ", size,
                        " bytes is not a whole number of ", kCifar10RecordBytes,
                        "-byte records (1 label + 3072 pixels)"));
    }
    const int64_t records = size / kCifar10RecordBytes;
    std::vector<uint8_t> labels(static_cast<size_t>(records));
    for (int64_t r = 0; r < records; ++r) {
      const uint8_t* record = bytes.data() + r * kCifar10RecordBytes;
      labels[static_cast<size_t>(r)] = record[0];
      set.pixels.insert(set.pixels.end(), record + 1, record + kCifar10RecordBytes);
    }
    check_labels(labels, kCifar10Classes, file, 0);
    set.labels.insert(set.labels.end(), labels.begin(), labels.end());
    set.count += records;
  }
  return set;
}

}  // namespace ddp::examples::data
