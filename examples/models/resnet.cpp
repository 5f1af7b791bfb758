#include "examples/models/resnet.h"

namespace ddp::examples::models {
namespace {

torch::nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride)
    : in_channels_(in_channels), out_channels_(out_channels), stride_(stride) {
  reset();
}

void BasicBlockImpl::reset() {
  conv1_ = register_module("conv1", conv3x3(in_channels_, out_channels_, stride_));
  bn1_ = register_module("bn1", torch::nn::BatchNorm2d(out_channels_));
  conv2_ = register_module("conv2", conv3x3(out_channels_, out_channels_, 1));
  bn2_ = register_module("bn2", torch::nn::BatchNorm2d(out_channels_));
  shortcut_ = register_module("shortcut", torch::nn::Sequential());
  if (stride_ != 1 || in_channels_ != out_channels_) {
    shortcut_->push_back(torch::nn::Conv2d(
        torch::nn::Conv2dOptions(in_channels_, out_channels_, 1).stride(stride_).bias(false)));
    shortcut_->push_back(torch::nn::BatchNorm2d(out_channels_));
  }
}

torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  torch::Tensor out = torch::relu(bn1_(conv1_(x)));
  out = bn2_(conv2_(out));
  return torch::relu(out + (shortcut_->is_empty() ? x : shortcut_->forward(x)));
}

ResNet18Impl::ResNet18Impl(int64_t in_channels, int64_t num_classes)
    : in_channels_(in_channels), num_classes_(num_classes) {
  reset();
}

void ResNet18Impl::reset() {
  stem_ = register_module("stem", conv3x3(in_channels_, 64, 1));
  stem_bn_ = register_module("stem_bn", torch::nn::BatchNorm2d(64));
  stages_ = register_module("stages", torch::nn::Sequential());
  int64_t channels = 64;
  for (int64_t width : {64, 128, 256, 512}) {
    const int64_t stride = width == 64 ? 1 : 2;
    stages_->push_back(BasicBlock(channels, width, stride));
    stages_->push_back(BasicBlock(width, width, 1));
    channels = width;
  }
  fc_ = register_module("fc", torch::nn::Linear(512, num_classes_));
}

torch::Tensor ResNet18Impl::forward(torch::Tensor x) {
  x = torch::relu(stem_bn_(stem_(x)));
  x = stages_->forward(x);
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc_(x);
}

}  // namespace ddp::examples::models
