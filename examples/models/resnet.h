#pragma once
// ResNet-18 for 32x32 inputs (CIFAR-10): a 3x3 stem without max-pool, four stages of two BasicBlocks
// (64, 128, 256, 512 channels; stride 2 from the second stage on), BatchNorm, global average pool, fc.
#include <torch/torch.h>

namespace ddp::examples::models {

class BasicBlockImpl : public torch::nn::Cloneable<BasicBlockImpl> {
 public:
  BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride);
  void reset() override;
  torch::Tensor forward(torch::Tensor x);

 private:
  int64_t in_channels_, out_channels_, stride_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::Sequential shortcut_{nullptr};  // empty when the shape does not change
};
TORCH_MODULE(BasicBlock);

class ResNet18Impl : public torch::nn::Cloneable<ResNet18Impl> {
 public:
  explicit ResNet18Impl(int64_t in_channels = 3, int64_t num_classes = 10);
  void reset() override;
  torch::Tensor forward(torch::Tensor x);

 private:
  int64_t in_channels_, num_classes_;
  torch::nn::Conv2d stem_{nullptr};
  torch::nn::BatchNorm2d stem_bn_{nullptr};
  torch::nn::Sequential stages_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(ResNet18);

}  // namespace ddp::examples::models
