#include "examples/train_options.h"

#include <cxxopts.hpp>

#include <algorithm>
#include <iostream>

#include "ddp/base/error.h"

namespace ddp::examples {

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kSingle: return "single";
    case Mode::kDp: return "dp";
    case Mode::kDdp: return "ddp";
  }
  return "?";
}

namespace {

constexpr const char* kDebugGroup = "debug";

template <typename T>
T positive(const cxxopts::ParseResult& result, const std::string& flag, T minimum) {
  const T value = result[flag].as<T>();
  if (value < minimum) throw UsageError(str("--", flag, " must be at least ", minimum, ", not ", value));
  return value;
}

// --comm-hook, --powersgd-rank, --powersgd-start-iter (after --mode is parsed).
void parse_comm_hook_flags(const cxxopts::ParseResult& result, TrainOptions& o) {
  o.comm_hook = result["comm-hook"].as<std::string>();
  const std::vector<std::string> known{"allreduce", "fp16", "bf16", "fp16_compress", "bf16_compress", "powersgd"};
  if (std::find(known.begin(), known.end(), o.comm_hook) == known.end()) {
    throw UsageError(str("--comm-hook: unknown hook '", o.comm_hook, "' (choose allreduce, fp16, bf16 or powersgd)"));
  }
  if (o.comm_hook != "allreduce" && o.mode != Mode::kDdp) {
    throw UsageError(str("--comm-hook ", o.comm_hook, " needs --mode ddp (the other modes do not communicate gradients)"));
  }
  o.powersgd_rank = positive<int64_t>(result, "powersgd-rank", 1);
  o.powersgd_start_iter = positive<int64_t>(result, "powersgd-start-iter", 2);
}

// --batch-policy, --global-batch-size (See Note [Batch policy] in examples/batch_policy.h).
void parse_batch_policy_flags(const cxxopts::ParseResult& result, TrainOptions& o) {
  const std::string policy = result["batch-policy"].as<std::string>();
  if (policy == "per-rank") {
    o.batch_policy = BatchPolicy::kPerRank;
  } else if (policy == "global") {
    o.batch_policy = BatchPolicy::kGlobal;
  } else {
    throw UsageError(str("--batch-policy must be per-rank or global, not '", policy, "'"));
  }
  o.global_batch_size = positive<int64_t>(result, "global-batch-size", 0);
  if (o.batch_policy == BatchPolicy::kGlobal && o.global_batch_size == 0) {
    throw UsageError("--batch-policy global needs --global-batch-size N (samples per optimizer step)");
  }
  if (o.batch_policy == BatchPolicy::kPerRank && o.global_batch_size > 0) {
    throw UsageError("--global-batch-size needs --batch-policy global (per-rank uses --batch-size)");
  }
  if (result.count("batch-size") && o.batch_policy == BatchPolicy::kGlobal) {
    throw UsageError("--batch-size and --batch-policy global: pass --global-batch-size alone");
  }
}

// --diloco and its companions (after --mode, --comm-hook, --zero and --amp are parsed).
void parse_diloco_flags(const cxxopts::ParseResult& result, TrainOptions& o) {
  o.diloco = positive<int64_t>(result, "diloco", 0);
  o.diloco_fragments = positive<int64_t>(result, "diloco-fragments", 1);
  o.diloco_delay = positive<int64_t>(result, "diloco-delay", 0);
  o.outer_lr = result["outer-lr"].as<double>();
  o.outer_momentum = result["outer-momentum"].as<double>();
  o.outer_dtype = result["outer-dtype"].as<std::string>();
  if (o.diloco == 0) {
    for (const char* flag : {"diloco-fragments", "diloco-delay", "outer-lr", "outer-momentum", "outer-dtype"}) {
      if (result.count(flag)) throw UsageError(str("--", flag, " needs --diloco H (inner steps between syncs)"));
    }
    return;
  }
  if (o.mode != Mode::kDdp) throw UsageError("--diloco needs --mode ddp (it averages over the ranks)");
  if (o.comm_hook != "allreduce") {
    throw UsageError(str("--diloco and --comm-hook ", o.comm_hook, ": DiLoCo sends no gradients; drop --comm-hook"));
  }
  if (o.zero) throw UsageError("--diloco and --zero: every rank steps all of its parameters; drop --zero");
  if (o.amp == amp::Precision::kFloat16) {
    throw UsageError("--diloco and --amp fp16: the GradScaler may skip inner steps; use --amp bf16");
  }
  if (!(o.outer_lr > 0)) throw UsageError(str("--outer-lr must be positive, not ", o.outer_lr));
  if (!(o.outer_momentum >= 0 && o.outer_momentum < 1)) {
    throw UsageError(str("--outer-momentum must be in [0, 1), not ", o.outer_momentum));
  }
  const std::vector<std::string> dtypes{"fp32", "bf16", "fp16", "int8"};  // ddp::parse_outer_dtype's
  if (std::find(dtypes.begin(), dtypes.end(), o.outer_dtype) == dtypes.end()) {
    throw UsageError(str("--outer-dtype must be fp32, bf16, fp16 or int8, not '", o.outer_dtype, "'"));
  }
  if (o.diloco_fragments > o.diloco) {
    throw UsageError(str("--diloco-fragments ", o.diloco_fragments, " exceeds --diloco ", o.diloco,
                         ": each fragment needs its own inner step"));
  }
  if (o.diloco_delay >= o.diloco / o.diloco_fragments) {  // ddp::DiLoCo's rule, in whole steps
    throw UsageError(str("--diloco-delay ", o.diloco_delay, " must be less than --diloco / --diloco-fragments (",
                         o.diloco, " / ", o.diloco_fragments, " = ", o.diloco / o.diloco_fragments, " steps)"));
  }
}

}  // namespace

std::optional<TrainOptions> parse_train_options(int argc, char** argv, const ProgramSpec& spec) {
  cxxopts::Options cli(spec.name, str("Trains a network on ", spec.dataset,
                                      " in one process, with DataParallel, or under ddp_launch with DDP."));
  const std::string models = join(spec.models, "|");
  cli.add_options()
      ("mode", "single | dp | ddp (ddp: start it with ddp_launch)", cxxopts::value<std::string>()->default_value("single"))
      ("model", models, cxxopts::value<std::string>()->default_value(spec.models.front()))
      ("epochs", "epochs to train", cxxopts::value<int64_t>()->default_value("5"))
      ("batch-size", "samples per step: per process in ddp, in total in single and dp", cxxopts::value<int64_t>()->default_value(str(spec.default_batch_size)))
      ("lr", "SGD learning rate", cxxopts::value<double>()->default_value(str(spec.default_lr)))
      ("lr-schedule", "cosine (from --lr down to 0 over the run, per step) or constant", cxxopts::value<std::string>()->default_value("cosine"))
      ("momentum", "SGD momentum", cxxopts::value<double>()->default_value("0.9"))
      ("weight-decay", "SGD weight decay", cxxopts::value<double>()->default_value(str(spec.default_weight_decay)))
      ("seed", "seed of the initial weights, the data order and the augmentation", cxxopts::value<uint64_t>()->default_value("0"))
      ("data-dir", "folder of the data set", cxxopts::value<std::string>()->default_value(spec.default_data_dir))
      ("checkpoint-dir", "write a checkpoint there after every epoch", cxxopts::value<std::string>()->default_value(""))
      ("checkpoint-every", "also checkpoint every N optimizer steps within an epoch (0: at epoch ends only)", cxxopts::value<int64_t>()->default_value("0"))
      ("resume", "continue from the newest valid checkpoint in --checkpoint-dir (an error when there are checkpoints but none is valid)")
      ("allow-fresh-start", "with --resume: start from scratch when no checkpoint is valid")
      ("grad-accum", "micro-batches per optimizer step (DDP syncs only the last: no_sync)", cxxopts::value<int64_t>()->default_value("1"))
      ("workers", "data loader threads (0: load in the training thread)", cxxopts::value<int64_t>()->default_value("0"))
      ("threads", "intra-op threads per process (0: $OMP_NUM_THREADS, else cores / processes on the node)", cxxopts::value<int64_t>()->default_value("0"))
      ("limit", "use only the first N training and test samples (0: all)", cxxopts::value<int64_t>()->default_value("0"))
      ("metrics-json", "write the run's figures to this JSON file", cxxopts::value<std::string>()->default_value(""))
      ("checkpoint-on-signal", "on this signal (USR1: Slurm's warning), write a checkpoint at the next step and stop", cxxopts::value<std::string>()->default_value(""))
      ("amp", "mixed precision: off | bf16 | fp16 (autocast; fp16 also scales the loss with a GradScaler)", cxxopts::value<std::string>()->default_value("off"))
      ("dp-replicas", "with --mode dp: N replicas on the CPU, each on its own thread (0: every CUDA device, else one)", cxxopts::value<int64_t>()->default_value("0"))
      ("zero", "with --mode ddp: shard the optimizer's state over the ranks (ZeroRedundancyOptimizer)")
      ("h,help", "print this help");
  // Debug flags for the tests, left out of --help.
  cli.add_options(kDebugGroup)
      ("save-params", "write the final parameters (float32, concatenated) to FILE", cxxopts::value<std::string>()->default_value(""))
      ("max-steps", "stop when the global step reaches N (an interruption)", cxxopts::value<int64_t>()->default_value("0"))
      ("log-samples", "each rank writes the samples it trains on (epoch index lines) to a new file in DIR", cxxopts::value<std::string>()->default_value(""))
      ("die-at-step", "the last rank SIGKILLs itself in optimizer step N (a lost worker)", cxxopts::value<int64_t>()->default_value("0"))
      ("die-after-spares", "with --die-at-step under ddp_launch --spares: it dies once N spares wait in the pool", cxxopts::value<int64_t>()->default_value("0"));
  cli.add_options()
      ("comm-hook", "ddp: allreduce | fp16 | bf16 | powersgd (gradient communication; see docs/ddp.md)", cxxopts::value<std::string>()->default_value("allreduce"))
      ("powersgd-rank", "ddp with --comm-hook powersgd: the rank of the approximation", cxxopts::value<int64_t>()->default_value("1"))
      ("powersgd-start-iter", "ddp with --comm-hook powersgd: steps all-reduced before compressing (>= 2)", cxxopts::value<int64_t>()->default_value("1000"))
      ("batch-policy", "when the world size changes at a resume, keep per-rank (--batch-size per rank) or global (--global-batch-size)", cxxopts::value<std::string>()->default_value("per-rank"))
      ("global-batch-size", "with --batch-policy global: samples per optimizer step, divided among the ranks", cxxopts::value<int64_t>()->default_value("0"))
      ("diloco", "ddp: DiLoCo, H local SGD steps between outer steps on the averaged change (0: off; see docs/ddp.md)", cxxopts::value<int64_t>()->default_value("0"))
      ("diloco-fragments", "with --diloco: streaming DiLoCo, the model synced in F fragments at staggered steps", cxxopts::value<int64_t>()->default_value("1"))
      ("diloco-delay", "with --diloco: inner steps a fragment's exchange overlaps before its outer step (< H / F)", cxxopts::value<int64_t>()->default_value("0"))
      ("outer-lr", "with --diloco: the outer SGD's learning rate", cxxopts::value<double>()->default_value("0.7"))
      ("outer-momentum", "with --diloco: the outer SGD's Nesterov momentum", cxxopts::value<double>()->default_value("0.9"))
      ("outer-dtype", "with --diloco: fp32 | bf16 | fp16 | int8, what the outer gradients travel as", cxxopts::value<std::string>()->default_value("fp32"));
  cxxopts::ParseResult result;
  try {
    result = cli.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(str(e.what(), " (see --help)"));
  }
  if (!result.unmatched().empty()) {
    throw UsageError(str("unexpected argument '", result.unmatched().front(), "' (see --help)"));
  }
  if (result.count("help")) {
    std::cout << cli.help({""}) << std::flush;
    return std::nullopt;
  }
  TrainOptions o;
  try {
    const std::string mode = result["mode"].as<std::string>();
    if (mode == "single") {
      o.mode = Mode::kSingle;
    } else if (mode == "dp") {
      o.mode = Mode::kDp;
    } else if (mode == "ddp") {
      o.mode = Mode::kDdp;
    } else {
      throw UsageError(str("--mode must be single, dp or ddp, not '", mode, "'"));
    }
    o.model = result["model"].as<std::string>();
    if (std::find(spec.models.begin(), spec.models.end(), o.model) == spec.models.end()) {
      throw UsageError(str("--model must be ", join(spec.models, " or "), ", not '", o.model, "'"));
    }
    o.epochs = positive<int64_t>(result, "epochs", 1);
    o.batch_size = positive<int64_t>(result, "batch-size", 1);
    o.lr = result["lr"].as<double>();
    if (!(o.lr > 0)) throw UsageError(str("--lr must be positive, not ", o.lr));
    const std::string schedule = result["lr-schedule"].as<std::string>();
    if (schedule != "cosine" && schedule != "constant") {
      throw UsageError(str("--lr-schedule must be cosine or constant, not '", schedule, "'"));
    }
    o.cosine_lr = schedule == "cosine";
    o.momentum = result["momentum"].as<double>();
    if (!(o.momentum >= 0 && o.momentum < 1)) throw UsageError(str("--momentum must be in [0, 1), not ", o.momentum));
    o.weight_decay = positive<double>(result, "weight-decay", 0.0);
    o.seed = result["seed"].as<uint64_t>();
    o.data_dir = result["data-dir"].as<std::string>();
    if (o.data_dir.empty()) throw UsageError(str("--data-dir is required: the folder of ", spec.dataset));
    o.checkpoint_dir = result["checkpoint-dir"].as<std::string>();
    o.checkpoint_every = positive<int64_t>(result, "checkpoint-every", 0);
    o.resume = result.count("resume") > 0;
    if (o.resume && o.checkpoint_dir.empty()) throw UsageError("--resume needs --checkpoint-dir");
    o.allow_fresh_start = result.count("allow-fresh-start") > 0;
    if (o.allow_fresh_start && !o.resume) throw UsageError("--allow-fresh-start needs --resume");
    o.grad_accum = positive<int64_t>(result, "grad-accum", 1);
    o.workers = positive<int64_t>(result, "workers", 0);
    o.threads = positive<int64_t>(result, "threads", 0);
    o.limit = positive<int64_t>(result, "limit", 0);
    o.metrics_json = result["metrics-json"].as<std::string>();
    o.save_params = result["save-params"].as<std::string>();
    o.max_steps = positive<int64_t>(result, "max-steps", 0);
    o.checkpoint_on_signal = result["checkpoint-on-signal"].as<std::string>();
    if (!o.checkpoint_on_signal.empty() && o.checkpoint_dir.empty()) {
      throw UsageError("--checkpoint-on-signal needs --checkpoint-dir");
    }
    parse_comm_hook_flags(result, o);
    try {
      o.amp = amp::parse_precision(result["amp"].as<std::string>());
    } catch (const InvalidArgument& e) {
      throw UsageError(str("--amp: ", e.what()));
    }
    o.dp_replicas = positive<int64_t>(result, "dp-replicas", 0);
    if (o.dp_replicas > 0 && o.mode != Mode::kDp) throw UsageError("--dp-replicas needs --mode dp");
    o.zero = result.count("zero") > 0;
    if (o.zero && o.mode != Mode::kDdp) throw UsageError("--zero needs --mode ddp (it shards over the ranks)");
    parse_batch_policy_flags(result, o);
    parse_diloco_flags(result, o);
    o.log_samples = result["log-samples"].as<std::string>();
    o.die_at_step = positive<int64_t>(result, "die-at-step", 0);
    o.die_after_spares = positive<int64_t>(result, "die-after-spares", 0);
    if (o.die_after_spares > 0 && o.die_at_step == 0) throw UsageError("--die-after-spares needs --die-at-step");
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(str(e.what(), " (see --help)"));
  }
  return o;
}

}  // namespace ddp::examples
