// Fashion-MNIST with the one-channel tutorial CNN; see docs/examples.md.
#include "examples/data/fashion_mnist.h"
#include "examples/train_common.h"

int main(int argc, char** argv) {
  ddp::examples::ProgramSpec spec;
  spec.name = "train_fashion_mnist";
  spec.dataset = "fashion-mnist";
  spec.default_data_dir = ddp::examples::data::kFashionMnistDefaultDir;
  spec.models = {"lenet"};
  // Tuned for 2 ranks: >= 90% test accuracy after 5 epochs (docs/examples.md).
  spec.default_lr = 0.03;
  spec.default_batch_size = 32;
  return ddp::examples::train_main(argc, argv, spec);
}
