#pragma once
// Fashion-MNIST from its four IDX files (gzip or plain), as Debian's dataset-fashion-mnist installs them.
#include <string>

#include "examples/data/image_set.h"

namespace ddp::examples::data {

constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";
constexpr int kFashionMnistClasses = 10;

// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte, each with or without ".gz" (the
// compressed file wins). Throws ddp::IoError naming the file: missing, wrong magic, truncated,
// images and labels that disagree in number, a label outside 0..9.
ImageSet load_fashion_mnist(const std::string& dir, Split split);

}  // namespace ddp::examples::data
