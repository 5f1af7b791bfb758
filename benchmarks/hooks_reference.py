"""PyTorch's Python DDP with PyTorch's communication hooks, on what `ddp_bench --mode ddp --comm-hook H`
runs (the models, synthetic data, per-rank batch and SGD of benchmarks/torch_ddp_reference.py, which
this script imports): the Python side of scripts/bench-hooks.sh. Run under torchrun:

  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 benchmarks/hooks_reference.py --model resnet18 \
      --comm-hook powersgd --powersgd-rank 2

--comm-hook: allreduce (no hook: PyTorch's reducer), fp16 / bf16 (fp16_compress_hook /
bf16_compress_hook), powersgd (powerSGD_hook; start_powerSGD_iter as --powersgd-start-iter, the
other arguments PyTorch's defaults, as ddp_bench uses them).
Prints one line: "torch_hooks model=... hook=... world=... batch_per_rank=... samples_per_s=... step_ms=..."
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "tests", "ddp"))
import torch_ddp_reference as reference  # noqa: E402  (models and data)
from powersgd_reference import powersgd_state  # noqa: E402  (PowerSGDState without numpy)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="lenet", choices=["lenet", "resnet18"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--pool-batches", type=int, default=4)
    parser.add_argument("--comm-hook", default="allreduce", choices=["allreduce", "fp16", "bf16", "powersgd"])
    parser.add_argument("--powersgd-rank", type=int, default=1)
    parser.add_argument("--powersgd-start-iter", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = reference.synthetic_batches(args, rank)
    torch.manual_seed(0)
    net = reference.ResNet18() if args.model == "resnet18" else reference.LeNet(1, 28)
    model = torch.nn.parallel.DistributedDataParallel(net)
    if args.comm_hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.comm_hook == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif args.comm_hook == "powersgd":
        state = powersgd_state(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                               start_powerSGD_iter=args.powersgd_start_iter)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dist.barrier()
    steps = []
    for i in range(args.warmup + args.iters):
        if i == args.warmup:
            start = time.perf_counter()
        t0 = time.perf_counter()
        x, y = next(batches)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if i >= args.warmup:
            steps.append((time.perf_counter() - t0) * 1e3)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    steps.sort()
    if rank == 0:
        hook = args.comm_hook + (f"(r={args.powersgd_rank})" if args.comm_hook == "powersgd" else "")
        print(f"torch_hooks model={args.model} hook={hook} world={world} batch_per_rank={args.batch} "
              f"samples_per_s={world * args.batch * args.iters / elapsed.item():.2f} "
              f"step_ms={steps[len(steps) // 2]:.1f} final_loss={loss.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
