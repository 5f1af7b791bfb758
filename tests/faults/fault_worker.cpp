// Worker of the fault-injection tests (test_faults.cpp starts it through ddp_launch): a small DDP
// training loop with checkpoints, and one fault injected where DDP_FAULT says.
//
//   fault_worker train --steps N [--step-ms M] [--spin-ms C] [--timeout-ms T] [--checkpoint-dir D]
//                      [--checkpoint-every K] [--resume] [--save-params FILE] [--pid-dir D]
//                      [--say-first-step] [--say-steps]
//   fault_worker verify DIR      prints "latest valid checkpoint: step N" (find_latest_valid_checkpoint)
//
// DDP_FAULT="rank=R,step=S,kind=K[,attempt=A]" (read in parse_fault only): when rank R is about to
// run step S (1-based) in restart attempt A (default 0, TORCHELASTIC_RESTART_COUNT), it
//   exit     exits with code 3          segv     raises SIGSEGV        sigkill  raises SIGKILL
//   hang     sleeps (inside the step, before its forward and all-reduce) until it is killed
//   hang_noterm  the same, ignoring SIGTERM (only SIGKILL ends it, like a rank stuck in a driver call)
//   ckpt     starts writing checkpoint step-S and SIGKILLs itself half-way through model.pt
//   desync   issues one extra collective (a barrier) before step S: from then on its collectives
//            are not the others' (the same sequence number, another operation)
// Each rank writes its pid to D/rank<R>.attempt<A>.pid, so that the test can check /proc.
// The data of a step depend only on (step, rank), so a resumed run sees what an uninterrupted one
// sees; --save-params writes the final parameters' raw bytes (rank 0) for a bit-for-bit comparison.
// --say-first-step: rank 0 prints "trained a step in attempt A at NS" (steady clock, ns) after its
// first step, so that scripts/bench-hosts.sh times a restart from the fault to training again.
// --spin-ms C: each step also computes for C ms of CPU time (this thread's clock: a CPU quota or a
// shared core makes the step longer, as on a slow host), after its sleep of --step-ms.
// --say-steps: every rank prints "step S done" after each step, so that the bench counts the steps
// a restart trains again (the last before the loss minus the one "resumed from step" names).
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "ddp/runtime/agent_channel.h"
#include "ddp/checkpoint/checkpoint.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/base/error.h"
#include "ddp/distributed/process_group.h"
#include "ddp/runtime/run_main.h"

namespace fs = std::filesystem;

namespace {

struct Fault {
  int rank = -1;  // -1: no fault
  int64_t step = 0;
  std::string kind;
  int attempt = 0;
};

// The one place that reads DDP_FAULT.
Fault parse_fault(const char* text) {
  Fault fault;
  if (text == nullptr || *text == '\0') return fault;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    DDP_CHECK(eq != std::string::npos, "DDP_FAULT: '", item, "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "rank") fault.rank = std::stoi(value);
    else if (key == "step") fault.step = std::stoll(value);
    else if (key == "kind") fault.kind = value;
    else if (key == "attempt") fault.attempt = std::stoi(value);
    else DDP_CHECK(false, "DDP_FAULT: unknown key '", key, "'");
  }
  DDP_CHECK(fault.kind == "exit" || fault.kind == "segv" || fault.kind == "sigkill" || fault.kind == "hang" ||
                fault.kind == "hang_noterm" || fault.kind == "ckpt" || fault.kind == "desync",
            "DDP_FAULT: kind must be exit|segv|sigkill|hang|hang_noterm|ckpt|desync, not '", fault.kind, "'");
  return fault;
}

std::map<std::string, std::string> parse_flags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 2; i < argc; ++i) {
    const std::string key = argv[i];
    DDP_CHECK(key.rfind("--", 0) == 0, "unexpected argument '", key, "'");
    const bool has_value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
    flags[key.substr(2)] = has_value ? argv[++i] : "1";
  }
  return flags;
}

int64_t flag_int(const std::map<std::string, std::string>& flags, const std::string& name, int64_t fallback) {
  const auto it = flags.find(name);
  return it == flags.end() ? fallback : std::stoll(it->second);
}

struct Net : torch::nn::Module {
  Net() {
    torch::manual_seed(11);
    hidden = register_module("hidden", torch::nn::Linear(8, 16));
    out = register_module("out", torch::nn::Linear(16, 1));
    to(torch::kDouble);
  }
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::tanh(hidden(x))); }
  torch::nn::Linear hidden{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE_IMPL(NetHolder, Net);

[[noreturn]] void die_in_checkpoint(const fs::path& root, int64_t step) {
  const ddp::CheckpointFile half_written{"model.pt", [](const ddp::ByteSink& sink) {
                                           const std::string bytes(4096, 'x');
                                           sink(bytes.data(), bytes.size());
                                           std::cout << "fault: killed while writing a checkpoint" << std::endl;
                                           ::raise(SIGKILL);
                                         }};
  ddp::write_checkpoint_directory(root, ddp::checkpoint_name(step), {half_written}, {root, 0, step, 1});
  std::abort();  // not reached
}

// Writes pid_dir/fault.at (steady clock, ns: CLOCK_MONOTONIC, the same in every process), so that
// the test can measure the time from the fault to the launcher's exit.
void inject(const Fault& fault, const fs::path& checkpoint_dir, const fs::path& pid_dir) {
  if (!pid_dir.empty()) {
    std::ofstream(pid_dir / "fault.at") << std::chrono::steady_clock::now().time_since_epoch().count() << "\n";
  }
  std::cout << "fault: " << fault.kind << " on rank " << fault.rank << " at step " << fault.step << std::endl;
  if (fault.kind == "exit") ::_exit(3);
  if (fault.kind == "segv") {
    // The default action, so that the process dies of the signal even where a handler is installed
    // (AddressSanitizer's turns a SIGSEGV into its own report and exit code 23).
    ::signal(SIGSEGV, SIG_DFL);
    ::raise(SIGSEGV);
  }
  if (fault.kind == "sigkill") ::raise(SIGKILL);
  if (fault.kind == "ckpt") die_in_checkpoint(checkpoint_dir, fault.step);
  if (fault.kind == "hang_noterm") ::signal(SIGTERM, SIG_IGN);
  while (true) std::this_thread::sleep_for(std::chrono::hours(1));  // hang
}

// Computes until this thread has used `ns` of CPU time.
void spin(int64_t ns) {
  const auto used = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
  };
  const int64_t until = used() + ns;
  volatile double sink = 1;
  while (used() < until) {
    for (int i = 0; i < 1000; ++i) sink = sink * 1.0000001 + 1e-9;
  }
}

int train(const std::map<std::string, std::string>& flags) {
  const Fault fault = parse_fault(std::getenv("DDP_FAULT"));
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const int attempt = restart == nullptr ? 0 : std::stoi(restart);
  const int64_t steps = flag_int(flags, "steps", 10);
  const auto step_time = std::chrono::milliseconds(flag_int(flags, "step-ms", 0));
  const int64_t spin_ns = flag_int(flags, "spin-ms", 0) * 1000000;
  const int64_t every = flag_int(flags, "checkpoint-every", 1);
  const fs::path checkpoint_dir = flags.count("checkpoint-dir") ? flags.at("checkpoint-dir") : "";
  const fs::path pid_dir = flags.count("pid-dir") ? flags.at("pid-dir") : "";

  if (!pid_dir.empty()) {  // before the rendezvous, so that ranks stuck in it are known too
    const char* rank = std::getenv("RANK");
    std::ofstream(pid_dir / (std::string("rank") + (rank ? rank : "0") + ".attempt" + std::to_string(attempt) +
                             ".pid"))
        << ::getpid() << "\n";
  }
  ddp::InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::milliseconds(flag_int(flags, "timeout-ms", 30000));
  // Joining has its own bound (Note [Waiting is never silent]); the fault tests bound it the same.
  init.join_timeout = init.timeout;
  auto group = ddp::init_process_group(init);
  const int rank = group->rank();
  NetHolder net;
  ddp::DistributedDataParallel<NetHolder> model(net, group);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  int64_t step = 0;
  if (flags.count("resume")) {
    if (const auto latest = ddp::find_latest_valid_checkpoint(checkpoint_dir)) {
      step = ddp::load_checkpoint(latest->path, *net, &optimizer).step;
      std::cout << "resumed from step " << step << std::endl;
    }
  }
  const bool armed = fault.rank == rank && fault.attempt == attempt;
  ddp::ProgressReporter progress;  // samples and loss for ddp_launch --metrics_port
  bool say_first_step = flags.count("say-first-step") > 0 && rank == 0;
  const bool say_steps = flags.count("say-steps") > 0;
  while (step < steps) {
    if (armed && step + 1 == fault.step) {
      if (fault.kind != "desync") inject(fault, checkpoint_dir, pid_dir);
      std::cout << "fault: desync on rank " << rank << " at step " << fault.step << std::endl;
      group->barrier();
    }
    torch::manual_seed(1000 * step + rank);  // this step's data on this rank, whatever came before
    const auto x = torch::randn({16, 8}, torch::kDouble);
    const auto y = x.sum(1, /*keepdim=*/true).sin();
    optimizer.zero_grad();
    const auto loss = torch::mse_loss(model.forward(x), y);
    loss.backward();
    optimizer.step();
    ++step;
    progress.report(x.size(0), loss.item<double>());
    if (say_first_step) {
      say_first_step = false;
      std::cout << "trained a step in attempt " << attempt << " at "
                << std::chrono::steady_clock::now().time_since_epoch().count() << std::endl;
    }
    if (say_steps) std::cout << "step " << step << " done" << std::endl;
    std::this_thread::sleep_for(step_time);
    spin(spin_ns);
    if (!checkpoint_dir.empty() && step % every == 0) {
      ddp::save_checkpoint(checkpoint_dir, *net, &optimizer, {0, step, {}}, group);
      std::cout << "checkpoint step " << step << std::endl;
    }
  }
  if (flags.count("save-params") && rank == 0) {
    std::ofstream out(flags.at("save-params"), std::ios::binary);
    for (const auto& p : net->parameters()) {
      const auto data = p.contiguous();
      out.write(static_cast<const char*>(data.data_ptr()), static_cast<std::streamsize>(data.nbytes()));
    }
  }
  group->barrier();
  std::cout << "finished " << step << " steps" << std::endl;
  return 0;
}

int worker_main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "train") return train(parse_flags(argc, argv));
  if (mode == "verify" && argc == 3) {
    const auto latest = ddp::find_latest_valid_checkpoint(argv[2]);
    if (!latest) {
      std::cout << "no valid checkpoint\n";
      return 1;
    }
    ddp::verify_checkpoint(latest->path);
    std::cout << "latest valid checkpoint: step " << latest->step << "\n";
    return 0;
  }
  std::cerr << "usage: fault_worker train [--steps N ...] | verify DIR\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) { return ddp::run_main(argc, argv, worker_main); }
