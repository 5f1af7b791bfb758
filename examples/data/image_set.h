#pragma once
// A labelled image set as read from disk: raw bytes, no LibTorch, so the readers stay fast to build.
#include <cstdint>
#include <vector>

namespace ddp::examples::data {

enum class Split { kTrain, kTest };

// count images of channels x height x width bytes each, channel-major (CHW) per image.
struct ImageSet {
  int64_t count = 0;
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> pixels;  // count * channels * height * width
  std::vector<uint8_t> labels;  // count, each < the number of classes

  int64_t image_bytes() const { return channels * height * width; }
  // Keeps the first n images (all of them when n <= 0 or n >= count).
  void truncate(int64_t n);
};

}  // namespace ddp::examples::data
