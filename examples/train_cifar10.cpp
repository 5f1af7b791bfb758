// CIFAR-10 (binary version) with the tutorial CNN or ResNet-18; see docs/examples.md.
#include "examples/train_common.h"

int main(int argc, char** argv) {
  ddp::examples::ProgramSpec spec;
  spec.name = "train_cifar10";
  spec.dataset = "cifar10";
  spec.default_data_dir = "";  // the set cannot be shipped: --data-dir names the folder
  spec.models = {"lenet", "resnet18"};
  spec.default_lr = 0.05;
  spec.default_weight_decay = 5e-4;
  return ddp::examples::train_main(argc, argv, spec);
}
