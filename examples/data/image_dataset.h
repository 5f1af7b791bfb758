#pragma once
// A torch::data dataset over an ImageSet held in memory as uint8, normalised (and, for training,
// augmented) batch by batch.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "examples/data/image_set.h"

namespace ddp::examples::data {

// Per-channel statistics of the raw pixels scaled to [0, 1].
struct Normalization {
  std::vector<float> mean;
  std::vector<float> std;
};
Normalization fashion_mnist_normalization();  // mean 0.2860, std 0.3530
Normalization cifar10_normalization();        // per channel (R, G, B)

// Note [Seeded augmentation]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The random flip and crop of a sample are a pure function of (seed, epoch, sample index), not a draw
// from a generator that advances as batches go by. So a sample is augmented the same way whichever rank
// or batch it lands in (DDP on R ranks and single on R*B samples see identical inputs), whichever loader
// thread builds it, and after --resume: there is no augmentation state to checkpoint.
struct AugmentOptions {
  bool flip = false;          // horizontal flip with probability 1/2
  int64_t crop_padding = 0;   // random crop of the original size after zero padding
  uint64_t seed = 0;
};

// The flip and the crop offsets of one sample; see Note [Seeded augmentation].
struct SampleAugmentation {
  bool flip = false;
  int64_t dy = 0, dx = 0;  // in 0 .. 2 * crop_padding
};
SampleAugmentation sample_augmentation(const AugmentOptions& options, int64_t epoch, uint64_t index);

class ImageDataset : public torch::data::datasets::BatchDataset<ImageDataset, torch::data::Example<>> {
 public:
  ImageDataset(const ImageSet& set, Normalization normalization, AugmentOptions augment = {});

  // The epoch whose augmentation get_batch applies.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  // Images [n, C, H, W] float, normalised and augmented; targets [n] int64.
  torch::data::Example<> get_batch(c10::ArrayRef<size_t> indices) override;
  std::optional<size_t> size() const override { return static_cast<size_t>(labels_.size(0)); }

  const torch::Tensor& labels() const { return labels_; }

 private:
  torch::Tensor images_;  // uint8 [N, C, H, W]
  torch::Tensor labels_;  // int64 [N]
  torch::Tensor mean_, std_;  // float [1, C, 1, 1]
  AugmentOptions augment_;
  int64_t epoch_ = 0;
};

}  // namespace ddp::examples::data
