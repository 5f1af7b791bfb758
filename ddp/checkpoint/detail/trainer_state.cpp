#include "ddp/checkpoint/detail/trainer_state.h"

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "ddp/checkpoint/detail/torch_zip.h"
#include "ddp/optim/zero_redundancy_optimizer.h"

namespace ddp::detail {
namespace fs = std::filesystem;
namespace optim = torch::optim;

namespace {

using Kind = PickleValue::Kind;
using Betas = std::tuple<double, double>;
constexpr int64_t kTrainerVersion = 2;

// Adam and AdamW have the same options and state under the same names.
template <typename AdamLikeOptions, typename Visitor>
void visit_adam_options(AdamLikeOptions& o, Visitor& visit) {
  visit("lr", o.lr());
  visit("betas", o.betas());
  visit("eps", o.eps());
  visit("weight_decay", o.weight_decay());
  visit("amsgrad", o.amsgrad());
}

template <typename AdamLikeState, typename Visitor>
void visit_adam_state(AdamLikeState& s, Visitor& visit) {
  visit("step", s.step());
  visit("exp_avg", s.exp_avg());
  visit("exp_avg_sq", s.exp_avg_sq());
  visit("max_exp_avg_sq", s.max_exp_avg_sq());
}

// Calls visit(name, field) for each option of the optimizer's param group, with PyTorch's names.
// False for an optimizer type this file does not know.
template <typename Visitor>
bool visit_options(optim::OptimizerOptions& options, Visitor& visit) {
  if (auto* o = dynamic_cast<optim::SGDOptions*>(&options)) {
    visit("lr", o->lr());
    visit("momentum", o->momentum());
    visit("dampening", o->dampening());
    visit("weight_decay", o->weight_decay());
    visit("nesterov", o->nesterov());
  } else if (auto* o = dynamic_cast<optim::AdamOptions*>(&options)) {
    visit_adam_options(*o, visit);
  } else if (auto* o = dynamic_cast<optim::AdamWOptions*>(&options)) {
    visit_adam_options(*o, visit);
  } else if (auto* o = dynamic_cast<optim::AdagradOptions*>(&options)) {
    visit("lr", o->lr());
    visit("lr_decay", o->lr_decay());
    visit("weight_decay", o->weight_decay());
    visit("initial_accumulator_value", o->initial_accumulator_value());
    visit("eps", o->eps());
  } else if (auto* o = dynamic_cast<optim::RMSpropOptions*>(&options)) {
    visit("lr", o->lr());
    visit("alpha", o->alpha());
    visit("eps", o->eps());
    visit("weight_decay", o->weight_decay());
    visit("momentum", o->momentum());
    visit("centered", o->centered());
  } else {
    return false;
  }
  return true;
}

// The same for one parameter's state.
template <typename Visitor>
void visit_param_state(optim::OptimizerParamState& state, Visitor& visit) {
  if (auto* s = dynamic_cast<optim::SGDParamState*>(&state)) {
    visit("momentum_buffer", s->momentum_buffer());
  } else if (auto* s = dynamic_cast<optim::AdamParamState*>(&state)) {
    visit_adam_state(*s, visit);
  } else if (auto* s = dynamic_cast<optim::AdamWParamState*>(&state)) {
    visit_adam_state(*s, visit);
  } else if (auto* s = dynamic_cast<optim::AdagradParamState*>(&state)) {
    visit("sum", s->sum());
    visit("step", s->step());
  } else if (auto* s = dynamic_cast<optim::RMSpropParamState*>(&state)) {
    visit("step", s->step());
    visit("square_avg", s->square_avg());
    visit("momentum_buffer", s->momentum_buffer());
    visit("grad_avg", s->grad_avg());
  }
}

// An empty per-parameter state of the optimizer type that `options` belong to.
std::unique_ptr<optim::OptimizerParamState> new_param_state(optim::OptimizerOptions& options) {
  if (dynamic_cast<optim::SGDOptions*>(&options)) return std::make_unique<optim::SGDParamState>();
  if (dynamic_cast<optim::AdamOptions*>(&options)) return std::make_unique<optim::AdamParamState>();
  if (dynamic_cast<optim::AdamWOptions*>(&options)) return std::make_unique<optim::AdamWParamState>();
  if (dynamic_cast<optim::AdagradOptions*>(&options)) return std::make_unique<optim::AdagradParamState>();
  return std::make_unique<optim::RMSpropParamState>();  // visit_options() knew the type
}

// Writes each visited field into a dict (undefined tensors are left out, as Python's state has none).
struct DictWriter {
  c10::impl::GenericDict dict = string_dict();
  void operator()(const char* name, double value) { dict.insert(name, value); }
  void operator()(const char* name, bool value) { dict.insert(name, value); }
  void operator()(const char* name, int64_t value) { dict.insert(name, value); }
  void operator()(const char* name, const Betas& value) {
    dict.insert(name, c10::ivalue::Tuple::create(std::get<0>(value), std::get<1>(value)));
  }
  void operator()(const char* name, const torch::Tensor& value) {
    if (value.defined()) dict.insert(name, value.detach().to(torch::kCPU));
  }
};

// Reads each visited field from a dict; a missing number is an error, a missing tensor stays undefined.
struct DictReader {
  const PickleValue& dict;
  const torch::Device& device;
  const std::string& where;  // "<file>: param group 0" for errors

  [[noreturn]] void fail(const char* name, const char* what) const {
    throw IoError(str(where, ": '", name, "' is ", what));
  }
  const PickleValue& need(const char* name) const {
    const PickleValue* value = dict.find(name);
    if (value == nullptr) fail(name, "missing");
    return *value;
  }
  static bool number(const PickleValue& value, double& out) {
    if (value.kind == Kind::kReal) out = value.real;
    else if (value.kind == Kind::kInteger) out = static_cast<double>(value.integer);
    else if (value.kind == Kind::kTensor && value.tensor.numel() == 1) out = value.tensor.item<double>();
    else return false;
    return true;
  }
  void operator()(const char* name, double& field) const {
    if (!number(need(name), field)) fail(name, "not a number");
  }
  void operator()(const char* name, bool& field) const {
    const PickleValue& value = need(name);
    if (value.kind != Kind::kBoolean) fail(name, "not a boolean");
    field = value.integer != 0;
  }
  void operator()(const char* name, int64_t& field) const {
    const PickleValue& value = need(name);
    double real = 0;
    if (value.kind == Kind::kInteger) field = value.integer;
    else if (number(value, real)) field = static_cast<int64_t>(real);  // Python's Adam: a float tensor
    else fail(name, "not an integer");
  }
  void operator()(const char* name, Betas& field) const {
    const PickleValue& value = need(name);
    double first = 0, second = 0;
    if (!value.items || value.items->size() != 2 || !number((*value.items)[0], first) ||
        !number((*value.items)[1], second)) {
      fail(name, "not a pair of numbers");
    }
    field = {first, second};
  }
  void operator()(const char* name, torch::Tensor& field) const {
    const PickleValue* value = dict.find(name);
    if (value == nullptr || value->kind == Kind::kNone) return;
    if (value->kind != Kind::kTensor) fail(name, "not a tensor");
    field = value->tensor.to(device);
  }
};

int64_t integer_entry(const PickleValue& dict, const char* key, const std::string& file) {
  const PickleValue* value = dict.find(key);
  if (value == nullptr || value->kind != Kind::kInteger) {
    throw IoError(str(file, ": entry '", key, "' is missing"));
  }
  return value->integer;
}

// The loss scaler's state under Python's GradScaler.state_dict() keys.
c10::impl::GenericDict grad_scaler_dict(const amp::GradScalerState& state) {
  auto dict = string_dict();
  dict.insert("scale", state.scale);
  dict.insert("growth_factor", state.growth_factor);
  dict.insert("backoff_factor", state.backoff_factor);
  dict.insert("growth_interval", state.growth_interval);
  dict.insert("_growth_tracker", state.growth_tracker);
  return dict;
}

// trainer.pt's "grad_scaler": nullopt when absent (older files) or None.
std::optional<amp::GradScalerState> read_grad_scaler(const PickleValue& root, const std::string& file) {
  const PickleValue* saved = root.find("grad_scaler");
  if (saved == nullptr || saved->kind == Kind::kNone) return std::nullopt;
  if (saved->kind != Kind::kDict) throw IoError(str(file, ": entry 'grad_scaler' is not a dict"));
  amp::GradScalerState state;
  const torch::Device cpu = torch::kCPU;
  const std::string where = str(file, ": grad_scaler");
  DictReader reader{*saved, cpu, where};
  reader("scale", state.scale);
  reader("growth_factor", state.growth_factor);
  reader("backoff_factor", state.backoff_factor);
  reader("growth_interval", state.growth_interval);
  reader("_growth_tracker", state.growth_tracker);
  return state;
}

}  // namespace

c10::IValue optimizer_state_dict(const optim::Optimizer& optimizer) {
  if (const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer)) zero->check_state_is_whole();
  auto state = c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get());
  auto groups = any_list();
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    DictWriter options;
    // The visitors take fields by reference for reading too; DictWriter only reads them.
    if (!visit_options(const_cast<optim::OptimizerOptions&>(group.options()), options)) {
      throw InvalidArgument(
          "save_checkpoint: the optimizer's type is not one checkpoints can store (SGD, Adam, AdamW, "
          "Adagrad, RMSprop): pass optimizer = nullptr and save its state yourself");
    }
    auto params = any_list();
    for (const auto& parameter : group.params()) {
      const auto found = optimizer.state().find(parameter.unsafeGetTensorImpl());
      if (found != optimizer.state().end()) {
        DictWriter fields;
        visit_param_state(*found->second, fields);
        state.insert(index, fields.dict);
      }
      params.push_back(index++);
    }
    options.dict.insert("params", params);
    groups.push_back(options.dict);
  }
  auto result = string_dict();
  result.insert("state", state);
  result.insert("param_groups", groups);
  return result;
}

void load_optimizer_state_dict(optim::Optimizer& optimizer, const PickleValue& state_dict,
                               const torch::Device& device, const std::string& file) {
  const PickleValue* state = state_dict.find("state");
  const PickleValue* groups = state_dict.find("param_groups");
  if (state == nullptr || state->kind != Kind::kDict || groups == nullptr || groups->kind != Kind::kList) {
    throw IoError(str(file, ": the optimizer state has no 'state' dict and 'param_groups' list"));
  }
  auto& target_groups = optimizer.param_groups();
  if (groups->items->size() != target_groups.size()) {
    throw IoError(str(file, ": the optimizer state has ", groups->items->size(), " param groups, the optimizer ",
                      target_groups.size()));
  }
  // Everything is read into new objects first: a bad file leaves the optimizer as it was.
  std::unordered_map<int64_t, const PickleValue*> saved_states;  // by parameter index
  for (const auto& [key, value] : *state->entries) {
    if (key.kind != Kind::kInteger) throw IoError(str(file, ": the optimizer state has a key that is no integer"));
    saved_states[key.integer] = &value;
  }
  std::vector<std::unique_ptr<optim::OptimizerOptions>> new_options;
  ska::flat_hash_map<void*, std::unique_ptr<optim::OptimizerParamState>> new_state;
  int64_t index = 0;
  for (size_t g = 0; g < target_groups.size(); ++g) {
    const std::string where = str(file, ": param group ", g);
    const PickleValue& group = (*groups->items)[g];
    auto options = target_groups[g].options().clone();
    DictReader reader{group, device, where};
    if (group.kind != Kind::kDict || !visit_options(*options, reader)) {
      throw IoError(str(where, " is not a dict of options this optimizer has"));
    }
    const PickleValue* params = group.find("params");
    const auto& target_params = target_groups[g].params();
    if (params == nullptr || !params->items || params->items->size() != target_params.size()) {
      throw IoError(str(where, " does not list the optimizer's ", target_params.size(), " parameters"));
    }
    for (size_t p = 0; p < target_params.size(); ++p, ++index) {
      const PickleValue& id = (*params->items)[p];
      if (id.kind != Kind::kInteger) throw IoError(str(where, ": a parameter index is not an integer"));
      const auto found = saved_states.find(id.integer);
      if (found == saved_states.end()) continue;  // no state yet (e.g. SGD without momentum)
      const PickleValue* saved = found->second;
      if (saved->kind != Kind::kDict) throw IoError(str(where, ": the state of parameter ", id.integer, " is no dict"));
      auto param_state = new_param_state(*options);
      const std::string param_where = str(file, ": state of parameter ", id.integer);
      DictReader fields{*saved, device, param_where};
      visit_param_state(*param_state, fields);
      new_state[target_params[p].unsafeGetTensorImpl()] = std::move(param_state);
    }
    new_options.push_back(std::move(options));
  }
  for (size_t g = 0; g < target_groups.size(); ++g) target_groups[g].set_options(std::move(new_options[g]));
  optimizer.state() = std::move(new_state);
}

// ---- RNG state -------------------------------------------------------------------------------------

}  // namespace ddp::detail

// Public (ddp/checkpoint/checkpoint.h).
namespace ddp {

RngState get_rng_state() {
  RngState state;
  {
    auto generator = at::globalContext().defaultGenerator(torch::kCPU);
    std::lock_guard<std::mutex> lock(generator.mutex());
    state.cpu = generator.get_state();
  }
  if (torch::cuda::is_available()) {
    const auto devices = static_cast<size_t>(torch::cuda::device_count());
    for (size_t i = 0; i < devices; ++i) {
      auto generator = at::globalContext().defaultGenerator(
          torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
      std::lock_guard<std::mutex> lock(generator.mutex());
      state.cuda.push_back(generator.get_state());
    }
  }
  return state;
}

void set_rng_state(const RngState& state) {
  if (state.cpu.defined()) {
    auto generator = at::globalContext().defaultGenerator(torch::kCPU);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state.cpu);
  }
  const auto devices = torch::cuda::is_available() ? static_cast<size_t>(torch::cuda::device_count()) : 0;
  for (size_t i = 0; i < state.cuda.size() && i < devices; ++i) {
    auto generator = at::globalContext().defaultGenerator(
        torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state.cuda[i]);
  }
}

}  // namespace ddp

namespace ddp::detail {

// ---- trainer.pt -------------------------------------------------------------------------------------

void write_trainer_state(const optim::Optimizer* optimizer, const TrainingProgress& progress, bool with_rng,
                         const ByteSink& sink) {
  auto root = string_dict();
  root.insert("ddp_trainer_version", kTrainerVersion);
  root.insert("epoch", progress.epoch);
  root.insert("step", progress.step);
  auto sampler = string_dict();
  sampler.insert("epoch", progress.sampler.epoch);
  sampler.insert("position", progress.sampler.position);
  sampler.insert("num_replicas", progress.sampler.num_replicas);
  if (progress.sampler.offset) sampler.insert("offset", *progress.sampler.offset);
  root.insert("sampler", sampler);
  root.insert("optimizer", optimizer != nullptr ? optimizer_state_dict(*optimizer) : c10::IValue());
  if (with_rng) {
    const RngState rng = get_rng_state();
    auto states = string_dict();
    states.insert("cpu", rng.cpu.to(torch::kCPU));
    auto cuda = any_list();
    for (const auto& state : rng.cuda) cuda.push_back(state.to(torch::kCPU));
    states.insert("cuda", cuda);
    root.insert("rng", states);
  } else {
    root.insert("rng", c10::IValue());
  }
  root.insert("grad_scaler", progress.grad_scaler ? grad_scaler_dict(*progress.grad_scaler) : c10::IValue());
  write_torch_zip(root, sink);
}

TrainingProgress read_trainer_state(const fs::path& file, optim::Optimizer* optimizer, const torch::Device& device,
                                    bool restore_rng) {
  const std::string name = file.string();
  try {
    const PickleValue root = read_torch_zip(file, "training state");
    if (root.kind != Kind::kDict) throw IoError(str(name, ": holds no dict"));
    TrainingProgress progress;
    progress.epoch = integer_entry(root, "epoch", name);
    progress.step = integer_entry(root, "step", name);
    const PickleValue* sampler = root.find("sampler");
    if (sampler == nullptr) throw IoError(str(name, ": entry 'sampler' is missing"));
    progress.sampler.epoch = integer_entry(*sampler, "epoch", name);
    progress.sampler.position = integer_entry(*sampler, "position", name);
    progress.sampler.num_replicas = integer_entry(*sampler, "num_replicas", name);
    if (sampler->find("offset") != nullptr) progress.sampler.offset = integer_entry(*sampler, "offset", name);
    if (optimizer != nullptr) {
      const PickleValue* state = root.find("optimizer");
      if (state == nullptr || state->kind == Kind::kNone) {
        throw IoError(str(name, ": holds no optimizer state (it was saved without an optimizer)"));
      }
      load_optimizer_state_dict(*optimizer, *state, device, name);
    }
    progress.grad_scaler = read_grad_scaler(root, name);
    const PickleValue* rng = root.find("rng");
    if (restore_rng && rng != nullptr && rng->kind == Kind::kDict) {
      RngState states;
      const PickleValue* cpu = rng->find("cpu");
      const PickleValue* cuda = rng->find("cuda");
      if (cpu == nullptr || cpu->kind != Kind::kTensor || cuda == nullptr || cuda->kind != Kind::kList) {
        throw IoError(str(name, ": entry 'rng' is not {'cpu': tensor, 'cuda': [tensors]}"));
      }
      states.cpu = cpu->tensor;
      for (const auto& state : *cuda->items) {
        if (state.kind != Kind::kTensor) throw IoError(str(name, ": a CUDA RNG state is not a tensor"));
        states.cuda.push_back(state.tensor);
      }
      set_rng_state(states);
    }
    return progress;
  } catch (const IoError& e) {
    // One line that says which step failed, as before; the reason keeps its own wording.
    std::string reason = e.what();
    if (reason.rfind(name + ": ", 0) == 0) reason.erase(0, name.size() + 2);
    throw IoError(str(name, ": cannot load the training state: ", reason));
  } catch (const c10::Error& e) {  // e.g. set_state() of an RNG state of the wrong size
    throw IoError(str(name, ": cannot load the training state: ", first_line(e.what_without_backtrace())));
  }
}

}  // namespace ddp::detail
