#pragma once
// The classic CIFAR-10 tutorial network (conv 3->6 5x5, max-pool 2, conv 6->16 5x5, max-pool 2,
// fc 400->120->84->10, ReLU) and its one-channel variant for 28x28 Fashion-MNIST.
#include <torch/torch.h>

namespace ddp::examples::models {

// Note [LeNet on 28x28 inputs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Without padding a 28x28 image leaves 16x4x4 = 256 features after the second pool, not the 400 of the
// 32x32 network. Like LeNet-5 on MNIST, the one-channel variant pads the first convolution by 2, so
// both variants have exactly the same layers and parameter count; only conv1's input channels differ.
// A plain struct (c10d's style), constructed with the two values every LeNet needs.
struct LeNetOptions {
  LeNetOptions(int64_t in_channels, int64_t image_size) : in_channels(in_channels), image_size(image_size) {}
  int64_t in_channels;
  int64_t image_size;  // 32 (CIFAR-10) or 28 (Fashion-MNIST, see Note [LeNet on 28x28 inputs])
  int64_t num_classes = 10;
};

class LeNetImpl : public torch::nn::Cloneable<LeNetImpl> {
 public:
  explicit LeNetImpl(LeNetOptions options);
  void reset() override;
  torch::Tensor forward(torch::Tensor x);

  LeNetOptions options;

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr}, fc3_{nullptr};
};
TORCH_MODULE(LeNet);

}  // namespace ddp::examples::models
