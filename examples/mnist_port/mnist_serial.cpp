// A LibTorch training program written as LibTorch's MNIST example is: a plain module struct,
// train() and test() taking the model by reference, a dataset and a sequential sampler. It is the
// "before" of mnist_port.cpp, which is this file with exactly the changes of the README's "Port your
// program" (tests/package checks the difference line by line). Reads ./data/{train,t10k}-*-ubyte.
#include <torch/torch.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

// Where the MNIST files (train-images-idx3-ubyte, ...) are.
const char* const kDataRoot = "./data";
const int64_t kTrainBatchSize = 64;
const int64_t kTestBatchSize = 1000;
const int64_t kNumberOfEpochs = 3;
const int64_t kLogInterval = 10;

// The MNIST files in IDX format (yann.lecun.com/exdb/mnist), any number of images: LibTorch's
// MNIST dataset insists on exactly 60000 and 10000, which the tests do not ship.
class MnistFiles : public torch::data::datasets::Dataset<MnistFiles> {
 public:
  MnistFiles(const std::string& root, bool train) {
    const std::string prefix = root + (train ? "/train" : "/t10k");
    images_ = read_idx(prefix + "-images-idx3-ubyte", 0x803).to(torch::kFloat32).div_(255).unsqueeze(1);
    targets_ = read_idx(prefix + "-labels-idx1-ubyte", 0x801).to(torch::kInt64);
  }
  torch::data::Example<> get(size_t index) override { return {images_[index], targets_[index]}; }
  torch::optional<size_t> size() const override { return images_.size(0); }

 private:
  static torch::Tensor read_idx(const std::string& path, uint32_t magic) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    const auto read_u32 = [&] {
      unsigned char b[4] = {};
      in.read(reinterpret_cast<char*>(b), 4);
      return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | uint32_t{b[3]};
    };
    if (read_u32() != magic) throw std::runtime_error(path + " is not an IDX file of the expected kind");
    std::vector<int64_t> dims;
    for (uint32_t d = 0; d < (magic & 0xff); ++d) dims.push_back(read_u32());
    auto data = torch::empty(dims, torch::kUInt8);
    in.read(reinterpret_cast<char*>(data.data_ptr<uint8_t>()), data.numel());
    if (!in) throw std::runtime_error(path + " is truncated");
    return data;
  }
  torch::Tensor images_, targets_;
};

struct Net : torch::nn::Module {
  Net() {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, /*p=*/0.5, /*train=*/is_training());
    return torch::log_softmax(fc2->forward(x), /*dim=*/1);
  }

  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 10, 5)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(10, 20, 5)};
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1{320, 50};
  torch::nn::Linear fc2{50, 10};
};

template <typename DataLoader>
void train(size_t epoch, Net& model, torch::Device device, DataLoader& data_loader,
           torch::optim::Optimizer& optimizer, size_t dataset_size) {
  model.train();
  size_t batch_idx = 0;
  for (auto& batch : data_loader) {
    auto data = batch.data.to(device), targets = batch.target.to(device);
    optimizer.zero_grad();
    auto output = model.forward(data);
    auto loss = torch::nll_loss(output, targets);
    AT_ASSERT(!std::isnan(loss.template item<float>()));
    loss.backward();
    optimizer.step();

    if (batch_idx++ % kLogInterval == 0) {
      std::printf("\rTrain Epoch: %zu [%5zu/%5zu] Loss: %.4f", epoch, batch_idx * batch.data.size(0),
                  dataset_size, loss.template item<float>());
    }
  }
}

template <typename DataLoader>
void test(Net& model, torch::Device device, DataLoader& data_loader, size_t dataset_size) {
  torch::NoGradGuard no_grad;
  model.eval();
  double test_loss = 0;
  int32_t correct = 0;
  for (const auto& batch : data_loader) {
    auto data = batch.data.to(device), targets = batch.target.to(device);
    auto output = model.forward(data);
    test_loss += torch::nll_loss(output, targets, /*weight=*/{}, torch::Reduction::Sum).template item<float>();
    auto pred = output.argmax(1);
    correct += pred.eq(targets).sum().template item<int64_t>();
  }

  test_loss /= dataset_size;
  std::printf("\nTest set: Average loss: %.4f | Accuracy: %.3f\n", test_loss,
              static_cast<double>(correct) / dataset_size);
}

auto main() -> int {
  torch::manual_seed(1);

  torch::DeviceType device_type;
  if (torch::cuda::is_available()) {
    std::cout << "CUDA available! Training on GPU." << std::endl;
    device_type = torch::kCUDA;
  } else {
    std::cout << "Training on CPU." << std::endl;
    device_type = torch::kCPU;
  }
  torch::Device device(device_type);

  Net model;
  model.to(device);

  auto train_dataset = MnistFiles(kDataRoot, /*train=*/true)
                           .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                           .map(torch::data::transforms::Stack<>());
  const size_t train_dataset_size = train_dataset.size().value();
  auto train_loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(std::move(train_dataset), kTrainBatchSize);

  auto test_dataset = MnistFiles(kDataRoot, /*train=*/false)
                          .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                          .map(torch::data::transforms::Stack<>());
  const size_t test_dataset_size = test_dataset.size().value();
  auto test_loader = torch::data::make_data_loader(std::move(test_dataset), kTestBatchSize);

  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));

  for (size_t epoch = 1; epoch <= kNumberOfEpochs; ++epoch) {
    train(epoch, model, device, *train_loader, optimizer, train_dataset_size);
    test(model, device, *test_loader, test_dataset_size);
  }
}
