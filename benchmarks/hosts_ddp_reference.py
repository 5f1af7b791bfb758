"""PyTorch's Python DDP for scripts/bench-hosts.sh: the same small job as tests/faults' fault_worker
(a Linear(8,16)-tanh-Linear(16,1) network in double precision, 16 samples per rank and step, SGD lr
0.05 momentum 0.9, Gloo, a sleep of --step-ms after each step), so that the start-up and the host
loss of torchrun + Python DDP are timed on the same job as ddp_launch + C++ DDP. Run under torchrun:

  .venv/bin/torchrun --nnodes 3 --node_rank K --master_addr 198.18.0.1 --master_port 29500 \\
      --nproc_per_node 2 benchmarks/hosts_ddp_reference.py --steps 1

Prints "finished N steps" on each rank at the end, as fault_worker does. For the restart figure, as
fault_worker's DDP_FAULT=rank=R,step=S,kind=exit with --pid-dir D and --say-first-step: with
--fail-rank R --fail-step S --fault-file F, rank R writes CLOCK_MONOTONIC's ns to F and exits 3
before step S, unless F exists (once per job); with --say-first-step rank 0
prints "trained a step in attempt A at NS" after its first step.

For the steps a restart trains again (elastic host loss), as fault_worker's --checkpoint-dir D
--checkpoint-every K --resume --say-steps: rank 0 saves model, optimizer and step to D/latest.pt every
K steps (written to a temporary file, then renamed: a reader never sees half a checkpoint); with
--resume, every rank starts from D/latest.pt when it exists and prints "resumed from step S"; with
--say-steps, every rank prints "step S done" after each step.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-ms", type=float, default=0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-step", type=int, default=0)
    parser.add_argument("--fault-file", default="")
    parser.add_argument("--say-first-step", action="store_true")
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--say-steps", action="store_true")
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(11)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    say_first_step = args.say_first_step and rank == 0
    latest = os.path.join(args.checkpoint_dir, "latest.pt") if args.checkpoint_dir else ""
    start = 0
    if args.resume and latest and os.path.exists(latest):
        saved = torch.load(latest)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = saved["step"]
        print(f"resumed from step {start}", flush=True)
    for step in range(start, args.steps):
        # Once: torchrun's restart count grows only on the agents whose own workers failed.
        if rank == args.fail_rank and step + 1 == args.fail_step and not os.path.exists(args.fault_file):
            with open(args.fault_file, "w") as f:
                f.write(f"{time.monotonic_ns()}\n")
            print(f"fault: exit on rank {rank} at step {step + 1}", flush=True)
            os._exit(3)
        torch.manual_seed(1000 * step + rank)
        x = torch.randn(16, 8, dtype=torch.double)
        y = x.sum(1, keepdim=True).sin()
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if say_first_step:
            say_first_step = False
            print(f"trained a step in attempt {attempt} at {time.monotonic_ns()}", flush=True)
        if args.say_steps:
            print(f"step {step + 1} done", flush=True)
        time.sleep(args.step_ms / 1000)
        if latest and rank == 0 and (step + 1) % args.checkpoint_every == 0:
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            partial = f"{latest}.{os.getpid()}.tmp"
            torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}, partial)
            os.replace(partial, latest)
    dist.barrier()
    print(f"finished {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
