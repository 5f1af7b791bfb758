#include "examples/models/lenet.h"

#include "ddp/base/error.h"

namespace ddp::examples::models {

LeNetImpl::LeNetImpl(LeNetOptions options_) : options(options_) { reset(); }

void LeNetImpl::reset() {
  DDP_CHECK(options.image_size == 32 || options.image_size == 28, "LeNet takes 32x32 or 28x28 images, not ",
            options.image_size);
  // See Note [LeNet on 28x28 inputs].
  const int64_t padding = (32 - options.image_size) / 2;
  conv1_ = register_module("conv1", torch::nn::Conv2d(
      torch::nn::Conv2dOptions(options.in_channels, 6, 5).padding(padding)));
  conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 16, 5)));
  fc1_ = register_module("fc1", torch::nn::Linear(16 * 5 * 5, 120));
  fc2_ = register_module("fc2", torch::nn::Linear(120, 84));
  fc3_ = register_module("fc3", torch::nn::Linear(84, options.num_classes));
}

torch::Tensor LeNetImpl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(conv1_(x)), 2);
  x = torch::max_pool2d(torch::relu(conv2_(x)), 2);
  x = x.flatten(1);
  x = torch::relu(fc1_(x));
  x = torch::relu(fc2_(x));
  return fc3_(x);
}

}  // namespace ddp::examples::models
