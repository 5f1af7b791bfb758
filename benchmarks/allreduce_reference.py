"""PyTorch's own all-reduce on what `allreduce_bench` measures: `torch.distributed.all_reduce` of one
float32 tensor over Gloo, a correctness round, --warmup untimed and --iters timed all-reduces; time is
the mean per all-reduce of the slowest rank, busbw = bytes / time * 2 (n - 1) / n (the formulas of
benchmarks/scenarios/allreduce.cpp). The Python side of the busbw rows of scripts/bench-hooks.sh.
Run under torchrun:

  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 benchmarks/allreduce_reference.py --bytes 8388608

Prints one line: "torch_allreduce bytes=... world_size=... time_us=... busbw_GBps=... correct=OK|FAIL".
"""
import argparse
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=int, required=True, help="message size (a multiple of 4)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    if args.bytes <= 0 or args.bytes % 4 or args.warmup < 0 or args.iters < 1:
        parser.error("--bytes must be a positive multiple of 4, --warmup >= 0 and --iters >= 1")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # Correctness as allreduce_bench: rank r fills r + 1, every element must be n (n + 1) / 2.
    buffer = torch.full((args.bytes // 4,), float(rank + 1))
    dist.all_reduce(buffer)
    wrong = torch.tensor([float(buffer.ne(world * (world + 1) / 2).sum())])
    dist.all_reduce(wrong, op=dist.ReduceOp.MAX)
    buffer.zero_()
    for _ in range(args.warmup):
        dist.all_reduce(buffer)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(buffer)
    elapsed = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    seconds = elapsed.item() / args.iters
    busbw = args.bytes / seconds / 1e9 * 2 * (world - 1) / world
    if rank == 0:
        print(f"torch_allreduce bytes={args.bytes} world_size={world} time_us={seconds * 1e6:.2f} "
              f"busbw_GBps={busbw:.6f} correct={'OK' if wrong.item() == 0 else 'FAIL'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
