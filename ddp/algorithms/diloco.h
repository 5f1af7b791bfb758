#pragma once
// DiLoCo and streaming DiLoCo: H steps of any inner optimizer on each rank without communication,
// then an outer step (SGD with Nesterov momentum) on the average of the ranks' parameter changes.
//   ddp::DiLoCo diloco(pg, inner_optimizer, {.sync_every = 100});
//   for (...) { inner_optimizer.zero_grad(); loss(model(x)).backward(); diloco.step(); }
//   diloco.finish();  // a last outer step over what is left: every rank holds the same parameters
// Gradients are not all-reduced: wrap the model in DistributedDataParallel only with a hook that does
// not communicate (PostLocalSgdHook without subgroup), or not at all. See Note [DiLoCo] in diloco.cpp.
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/checkpoint/checkpoint.h"
#include "ddp/distributed/process_group.h"

namespace ddp {

// What the outer gradients travel as. bf16 and fp16 are all-reduced in that type; int8 is quantised
// per block of kOuterInt8Block values with a float scale each and all-gathered (See Note [Outer
// gradients in int8] in diloco.cpp).
enum class OuterDtype { kFloat32, kBFloat16, kFloat16, kInt8 };
inline constexpr std::int64_t kOuterInt8Block = 2048;

struct DiLoCoOptions {
  // H: inner steps between two syncs of a fragment.
  std::int64_t sync_every = 100;
  // The outer optimizer, PyTorch's SGD on the averaged change (the paper's 0.7 and 0.9, Nesterov).
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool nesterov = true;
  // F: the parameters in this many fragments of about equal size, fragment f (0-based) sent at inner
  // steps floor(H / F * (f + 1)) + k H (torchft's schedule). 1: plain DiLoCo.
  std::int64_t fragments = 1;
  // tau: inner steps that a fragment's exchange overlaps before its outer step is applied (0: at
  // once); less than H / F.
  std::int64_t sync_delay = 0;
  // At a fragment's outer step its local parameters become alpha * local + (1 - alpha) * global.
  double update_alpha = 0.0;
  OuterDtype outer_dtype = OuterDtype::kFloat32;
};

// Parses "fp32", "bf16", "fp16", "int8"; ddp::UsageError otherwise.
OuterDtype parse_outer_dtype(const std::string& name);
const char* outer_dtype_name(OuterDtype dtype);

class DiLoCo {
 public:
  // Every parameter of `inner`'s groups takes part, in their order. Throws ddp::InvalidArgument for
  // a null group, bad options or an optimizer without parameters.
  DiLoCo(std::shared_ptr<ProcessGroup> group, torch::optim::Optimizer& inner, DiLoCoOptions options = {});
  ~DiLoCo();
  DiLoCo(const DiLoCo&) = delete;
  DiLoCo& operator=(const DiLoCo&) = delete;

  // inner.step(), then synchronize().
  void step();
  // The two halves of step(), for ddp::FaultTolerant, whose apply() must not communicate:
  // inner_step() in apply, synchronize() at the start of the next compute (See Note [DiLoCo under
  // FaultTolerant] in diloco.cpp). synchronize() runs the exchanges due after the inner steps done
  // so far, once per step however often it is called.
  void inner_step();
  void synchronize();
  // Sends every fragment changed since its last exchange, waits for all, applies their outer steps
  // and sets every parameter to the global one: the ranks then hold the same parameters. A
  // collective: every rank calls it at the same inner step (the end of an epoch, a checkpoint).
  void finish();

  std::int64_t inner_steps() const;
  // Outer steps applied, one per fragment exchange.
  std::int64_t outer_steps() const;
  // Bytes this rank put on the wire for outer gradients (the payloads it contributed).
  std::int64_t bytes_sent() const;
  const DiLoCoOptions& options() const;
  // The fragment of each parameter (See diloco_fragments in detail/diloco_plan.h).
  const std::vector<int>& fragment_of_parameter() const;

  // The outer state: the global parameters, the outer optimizer's momentum, the counters and the
  // schedule. The same on every rank: rank 0 saves it with a checkpoint (save_state_dict), and
  // ddp::FaultTolerant hands it to joiners. Exchanges in flight are not part of it.
  StateDict state() const;
  // Throws ddp::InvalidArgument when `state` is not of these parameters and options.
  void load_state(const StateDict& state);
  // A new group (live recovery): exchanges in flight on the old one are dropped and sent again on
  // this one at the next synchronize().
  void reset_process_group(std::shared_ptr<ProcessGroup> group);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
