#include "examples/data/image_dataset.h"

#include "ddp/base/error.h"

namespace ddp::examples::data {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

torch::Tensor channel_tensor(const std::vector<float>& values) {
  return torch::tensor(values, torch::kFloat32).view({1, -1, 1, 1});
}

}  // namespace

Normalization fashion_mnist_normalization() { return {{0.2860f}, {0.3530f}}; }
Normalization cifar10_normalization() { return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}}; }

SampleAugmentation sample_augmentation(const AugmentOptions& options, int64_t epoch, uint64_t index) {
  uint64_t bits = splitmix64(splitmix64(splitmix64(options.seed) ^ static_cast<uint64_t>(epoch)) ^ index);
  SampleAugmentation a;
  a.flip = options.flip && (bits & 1) != 0;
  if (options.crop_padding > 0) {
    const auto range = static_cast<uint64_t>(2 * options.crop_padding + 1);
    a.dy = static_cast<int64_t>((bits >> 8) % range);
    a.dx = static_cast<int64_t>((bits >> 32) % range);
  } else {
    a.dy = a.dx = 0;
  }
  return a;
}

ImageDataset::ImageDataset(const ImageSet& set, Normalization normalization, AugmentOptions augment)
    : augment_(augment) {
  DDP_CHECK_EQ(static_cast<int64_t>(normalization.mean.size()), set.channels, "normalisation channels");
  DDP_CHECK_EQ(static_cast<int64_t>(set.pixels.size()), set.count * set.image_bytes(), "pixel bytes");
  images_ = torch::from_blob(const_cast<uint8_t*>(set.pixels.data()),
                             {set.count, set.channels, set.height, set.width}, torch::kUInt8)
                .clone();
  labels_ = torch::from_blob(const_cast<uint8_t*>(set.labels.data()), {set.count}, torch::kUInt8)
                .to(torch::kInt64);
  mean_ = channel_tensor(normalization.mean);
  std_ = channel_tensor(normalization.std);
}

torch::data::Example<> ImageDataset::get_batch(c10::ArrayRef<size_t> indices) {
  std::vector<int64_t> rows(indices.begin(), indices.end());
  const torch::Tensor index = torch::tensor(rows, torch::kInt64);
  torch::Tensor images = images_.index_select(0, index);
  if (augment_.flip || augment_.crop_padding > 0) {
    const int64_t pad = augment_.crop_padding;
    const int64_t h = images.size(2), w = images.size(3);
    const torch::Tensor padded = pad > 0 ? torch::constant_pad_nd(images, {pad, pad, pad, pad}, 0) : images;
    std::vector<torch::Tensor> out;
    out.reserve(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const SampleAugmentation a = sample_augmentation(augment_, epoch_, static_cast<uint64_t>(rows[i]));
      torch::Tensor image = padded[static_cast<int64_t>(i)].narrow(1, a.dy, h).narrow(2, a.dx, w);
      out.push_back(a.flip ? image.flip({2}) : image);
    }
    images = torch::stack(out);
  }
  images = (images.to(torch::kFloat32).div_(255.0f) - mean_) / std_;
  return {images, labels_.index_select(0, index)};
}

}  // namespace ddp::examples::data
