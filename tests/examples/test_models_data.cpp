// The models, the dataset transforms and the DataParallel baseline (on CPU "devices").
#include <torch/torch.h>

#include "ddp/parallel/data_parallel.h"
#include "examples/data/image_dataset.h"
#include "examples/models/lenet.h"
#include "examples/models/resnet.h"

#include <catch2/catch.hpp>

using namespace ddp::examples;

namespace {

int64_t parameter_count(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

data::ImageSet ramp_images(int64_t n, int64_t channels, int64_t size) {
  data::ImageSet set;
  set.count = n;
  set.channels = channels;
  set.height = set.width = size;
  for (int64_t i = 0; i < n * channels * size * size; ++i) set.pixels.push_back(static_cast<uint8_t>(i % 256));
  for (int64_t i = 0; i < n; ++i) set.labels.push_back(static_cast<uint8_t>(i % 10));
  return set;
}

}  // namespace

TEST_CASE("both LeNet variants have the classic layers and give 10 logits", "[models]") {
  models::LeNet cifar(models::LeNetOptions(3, 32));
  models::LeNet fashion(models::LeNetOptions(1, 28));
  CHECK((cifar->forward(torch::randn({2, 3, 32, 32})).sizes() == torch::IntArrayRef{2, 10}));
  CHECK((fashion->forward(torch::randn({2, 1, 28, 28})).sizes() == torch::IntArrayRef{2, 10}));
  // conv 3->6 5x5, conv 6->16 5x5, fc 400->120->84->10, with biases.
  const int64_t shared = (6 * 16 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10);
  CHECK(parameter_count(*cifar) == shared + 3 * 6 * 25 + 6);
  CHECK(parameter_count(*fashion) == shared + 1 * 6 * 25 + 6);
  CHECK_THROWS_AS(models::LeNet(models::LeNetOptions(1, 30)), ddp::Error);
}

TEST_CASE("ResNet-18 for 32x32 inputs has 11.17M parameters and BatchNorm", "[models]") {
  models::ResNet18 net(3, 10);
  CHECK(parameter_count(*net) == 11173962);
  net->eval();
  CHECK((net->forward(torch::randn({2, 3, 32, 32})).sizes() == torch::IntArrayRef{2, 10}));
  int batch_norms = 0;
  for (const auto& m : net->modules()) batch_norms += m->as<torch::nn::BatchNorm2d>() != nullptr;
  CHECK(batch_norms == 20);  // stem + 2 per block x 8 + 3 shortcuts
}

TEST_CASE("ImageDataset normalises and augments each sample from (seed, epoch, index) only", "[data]") {
  const data::ImageSet set = ramp_images(8, 3, 32);
  data::ImageDataset plain(set, data::cifar10_normalization());
  auto batch = plain.get_batch({2, 5});
  CHECK((batch.data.sizes() == torch::IntArrayRef{2, 3, 32, 32}));
  CHECK((batch.target.equal(torch::tensor({2, 5}, torch::kInt64))));
  const float raw = set.pixels[5 * 3072 + 1024 + 7];  // image 5, green, row 0, column 7
  CHECK(batch.data[1][1][0][7].item<float>() == Approx((raw / 255.0 - 0.4822) / 0.2435).epsilon(1e-5));

  data::AugmentOptions augment;
  augment.flip = true;
  augment.crop_padding = 4;
  augment.seed = 7;
  data::ImageDataset augmented(set, data::cifar10_normalization(), augment);
  augmented.set_epoch(3);
  // A sample looks the same whatever batch it is in and whichever other samples come with it.
  const auto alone = augmented.get_batch({5}).data[0];
  const auto together = augmented.get_batch({1, 5, 6}).data[1];
  CHECK(alone.equal(together));
  // It is the crop at (dy, dx) of the image padded by 4 black pixels, then maybe flipped.
  const data::SampleAugmentation a = data::sample_augmentation(augment, 3, 5);
  for (int64_t y = 0; y < 32; ++y) {
    for (int64_t x = 0; x < 32; ++x) {
      const int64_t sx = a.flip ? 31 - x : x;
      const int64_t ry = y + a.dy - 4, rx = sx + a.dx - 4;
      const bool in = ry >= 0 && ry < 32 && rx >= 0 && rx < 32;
      const float pixel = in ? set.pixels[static_cast<size_t>(5 * 3072 + 2 * 1024 + ry * 32 + rx)] : 0.0f;
      REQUIRE(alone[2][y][x].item<float>() == Approx((pixel / 255.0 - 0.4465) / 0.2616).epsilon(1e-5));
    }
  }
  // Different epochs draw differently for some samples.
  int differ = 0;
  for (uint64_t i = 0; i < 64; ++i) {
    const auto x = data::sample_augmentation(augment, 0, i), y = data::sample_augmentation(augment, 1, i);
    differ += x.flip != y.flip || x.dx != y.dx || x.dy != y.dy;
  }
  CHECK(differ > 32);
}

TEST_CASE("DataParallel over several CPU devices computes the module's outputs and gradients", "[data_parallel]") {
  torch::manual_seed(1);
  models::LeNet reference(models::LeNetOptions(1, 28));
  models::LeNet model(models::LeNetOptions(1, 28));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model->parameters().size(); ++i) model->parameters()[i].copy_(reference->parameters()[i]);
  }
  ddp::DataParallelOptions options;
  options.devices = std::vector<torch::Device>{torch::kCPU, torch::kCPU, torch::kCPU};
  ddp::DataParallel<models::LeNet> dp(model, options);
  CHECK(dp.devices().size() == 3);
  const torch::Tensor x = torch::randn({7, 1, 28, 28});  // 7 does not split evenly: chunks 3, 2, 2
  const torch::Tensor y = torch::randint(0, 10, {7}, torch::kInt64);
  const torch::Tensor out = dp(x);
  const torch::Tensor expected = reference->forward(x);
  CHECK(torch::allclose(out, expected, 1e-5, 1e-6));
  torch::nn::functional::cross_entropy(out, y).backward();
  torch::nn::functional::cross_entropy(expected, y).backward();
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    REQUIRE(model->parameters()[i].grad().defined());
    CHECK(torch::allclose(model->parameters()[i].grad(), reference->parameters()[i].grad(), 1e-4, 1e-6));
  }
  // A batch smaller than the number of devices uses fewer replicas.
  CHECK(dp(x.narrow(0, 0, 2)).size(0) == 2);
  CHECK(ddp::detail::scatter(x, {torch::kCPU, torch::kCPU, torch::kCPU})[0].size(0) == 3);
}

TEST_CASE("DataParallel keeps BatchNorm's running statistics of the first replica", "[data_parallel]") {
  torch::manual_seed(2);
  torch::nn::BatchNorm2d bn(3);
  ddp::DataParallelOptions options;
  options.devices = std::vector<torch::Device>{torch::kCPU, torch::kCPU};
  ddp::DataParallel<torch::nn::BatchNorm2d> dp(bn, options);
  const torch::Tensor x = torch::randn({4, 3, 5, 5}) * 3 + 1;
  dp(x);
  torch::nn::BatchNorm2d alone(3);
  alone->forward(x.narrow(0, 0, 2));  // replica 0 saw the first half of the batch
  CHECK(torch::allclose(bn->running_mean, alone->running_mean));
  CHECK(torch::allclose(bn->running_var, alone->running_var));
  CHECK(bn->num_batches_tracked.item<int64_t>() == 1);
}

TEST_CASE("DataParallel on the one device it has runs the module directly", "[data_parallel]") {
  models::LeNet model(models::LeNetOptions(3, 32));
  ddp::DataParallel<models::LeNet> dp(model);  // this machine: no CUDA, so the CPU
  REQUIRE(dp.devices().size() >= 1);
  const torch::Tensor x = torch::randn({4, 3, 32, 32});
  CHECK(torch::allclose(dp(x).cpu(), model->forward(x.to(dp.devices().front())).cpu()));
}
