#pragma once
// CIFAR-10's binary version: data_batch_1.bin ... data_batch_5.bin and test_batch.bin, each a
// sequence of records of 1 label byte and 3072 pixel bytes (1024 red, 1024 green, 1024 blue, row-major).
#include <string>
#include <vector>

#include "examples/data/image_set.h"

namespace ddp::examples::data {

constexpr int kCifar10Classes = 10;
constexpr int64_t kCifar10RecordBytes = 1 + 3 * 32 * 32;

// The files of a split, in the order they are read.
std::vector<std::string> cifar10_files(Split split);

// Reads the split from dir. Throws ddp::IoError naming the file: missing, empty, a size that is not a
// whole number of records (truncated), a label outside 0..9 (with the record's index).
ImageSet load_cifar10(const std::string& dir, Split split);

}  // namespace ddp::examples::data
