"""PyTorch's Python DDP for scripts/bench-hosts.sh: the same small job as tests/faults' fault_worker
(a Linear(8,16)-tanh-Linear(16,1) network in double precision, 16 samples per rank and step, SGD lr
0.05 momentum 0.9, Gloo, a sleep of --step-ms after each step), so that the start-up and the host
loss of torchrun + Python DDP are timed on the same job as ddp_launch + C++ DDP. Run under torchrun:

  .venv/bin/torchrun --nnodes 3 --node_rank K --master_addr 198.18.0.1 --master_port 29500 \\
      --nproc_per_node 2 benchmarks/hosts_ddp_reference.py --steps 1

Prints "finished N steps" on each rank at the end, as fault_worker does.
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-ms", type=float, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(11)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for step in range(args.steps):
        torch.manual_seed(1000 * step + rank)
        x = torch.randn(16, 8, dtype=torch.double)
        y = x.sum(1, keepdim=True).sin()
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        time.sleep(args.step_ms / 1000)
    dist.barrier()
    print(f"finished {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
