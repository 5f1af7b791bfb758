// Must NOT compile: a raw pointer is none of DistributedDataParallel's module forms. The test
// ddp.module_form_static_assert builds this file and expects exactly the static_assert of
// Note [Module forms], not errors from inside the template.
#include "ddp/ddp.h"

struct Net : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x; }
};

torch::Tensor wrap_a_raw_pointer(std::shared_ptr<ddp::ProcessGroup> pg) {
  Net* raw = nullptr;
  ddp::DistributedDataParallel ddp_model(raw, pg);
  ddp_model.train();
  return ddp_model(torch::ones({1}));
}
