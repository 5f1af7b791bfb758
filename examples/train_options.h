#pragma once
// The command line of the training programs, parsed once (cxxopts) into TrainOptions.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/amp/precision.h"

namespace ddp::examples {

enum class Mode { kSingle, kDp, kDdp };
// --batch-policy: what stays fixed when the world size changes (See Note [Batch policy]).
enum class BatchPolicy { kPerRank, kGlobal };
const char* mode_name(Mode mode);

// What differs between train_fashion_mnist and train_cifar10.
struct ProgramSpec {
  std::string name;              // e.g. "train_fashion_mnist"
  std::string dataset;           // "fashion-mnist" or "cifar10"
  std::string default_data_dir;  // empty: --data-dir is required
  std::vector<std::string> models;  // the first is the default
  double default_lr = 0.05;
  int64_t default_batch_size = 64;
  double default_weight_decay = 0.0;
};

struct TrainOptions {
  Mode mode = Mode::kSingle;
  std::string model;
  int64_t epochs = 5;
  int64_t batch_size = 64;  // per process in ddp, total in single and dp
  double lr = 0.05;
  double momentum = 0.9;
  bool cosine_lr = true;  // --lr-schedule cosine (default) or constant
  double weight_decay = 0.0;
  uint64_t seed = 0;
  std::string data_dir;
  std::string checkpoint_dir;  // empty: no checkpoints
  int64_t checkpoint_every = 0;  // also every N optimizer steps within an epoch (0: at epoch ends only)
  bool resume = false;
  bool allow_fresh_start = false;  // --resume with checkpoints but none valid: start from scratch, not fail
  int64_t grad_accum = 1;
  int64_t workers = 0;
  int64_t threads = 0;  // intra-op threads per process; 0: OMP_NUM_THREADS, else cores / local processes
  int64_t limit = 0;  // 0: every sample
  std::string metrics_json;
  std::string save_params;  // debug: final parameters, for the equivalence tests
  int64_t max_steps = 0;    // debug: stop when the global step reaches this (an interruption; 0: none)
  std::string checkpoint_on_signal;  // e.g. USR1: checkpoint and stop at the next step (empty: off)
  // ddp: the communication hook (ddp/algorithms/default_comm_hooks.h make_comm_hook: allreduce, fp16, bf16, powersgd).
  std::string comm_hook = "allreduce";
  int64_t powersgd_rank = 1;
  int64_t powersgd_start_iter = 1000;  // PyTorch's default
  amp::Precision amp = amp::Precision::kOff;  // --amp: autocast's dtype; fp16 adds a GradScaler
  int64_t dp_replicas = 0;  // --dp-replicas N: dp over N CPU replicas (0: every CUDA device, else one CPU)
  bool zero = false;        // --zero: the optimizer's state sharded over the ranks (ZeroRedundancyOptimizer)
  BatchPolicy batch_policy = BatchPolicy::kPerRank;  // --batch-policy per-rank | global
  int64_t global_batch_size = 0;  // --global-batch-size: samples per optimizer step (batch policy global)
  std::string log_samples;  // debug: each rank appends the samples it trains on to a file in this folder
  int64_t die_at_step = 0;  // debug: the last rank SIGKILLs itself in step N (See live_training.h; 0: off)
  int64_t die_after_spares = 0;  // debug: ... once N spares wait in the pool (See live_training.h)
  // --diloco H: DiLoCo over the SGD above (ddp/algorithms/diloco.h); 0: off. The outer optimizer
  // and streaming: --outer-lr, --outer-momentum, --diloco-fragments, --diloco-delay, --outer-dtype.
  int64_t diloco = 0;
  int64_t diloco_fragments = 1;
  int64_t diloco_delay = 0;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  std::string outer_dtype = "fp32";
};

// Parses argv. Returns nullopt after printing --help. Throws ddp::UsageError with a one-line
// message for an unknown flag, a bad value or an inconsistent combination.
std::optional<TrainOptions> parse_train_options(int argc, char** argv, const ProgramSpec& spec);

}  // namespace ddp::examples
