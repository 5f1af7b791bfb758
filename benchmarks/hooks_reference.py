"""PyTorch's Python DDP with PyTorch's communication hooks, on what `ddp_bench --mode ddp --comm-hook H`
runs: benchmarks/torch_ddp_reference.py (its models, synthetic data, per-rank batch, SGD and timed loop)
with the hook registered on its DistributedDataParallel. The Python side of scripts/bench-hooks.sh.
Run under torchrun:

  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 benchmarks/hooks_reference.py --model resnet18 \
      --comm-hook powersgd --powersgd-rank 2 --batch 8 --warmup 3 --iters 3

--comm-hook: allreduce (no hook: PyTorch's reducer), fp16 / bf16 (fp16_compress_hook /
bf16_compress_hook), powersgd (powerSGD_hook; start_powerSGD_iter as --powersgd-start-iter, the
other arguments PyTorch's defaults, as ddp_bench uses them). Every other flag is
torch_ddp_reference.py's. Prints its line ("torch_ddp model=... samples_per_s=...") after one naming
the hook ("torch_hooks hook=...").
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "tests", "ddp"))
import torch_ddp_reference as reference  # noqa: E402
from powersgd_reference import powersgd_state  # noqa: E402  (PowerSGDState without numpy)


def hooked_ddp(args):
    """torch_ddp_reference builds nn.parallel.DistributedDataParallel(net): this subclass registers
    the hook right after, before the first backward."""

    class HookedDistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, module, *rest, **kwargs):
            super().__init__(module, *rest, **kwargs)
            if args.comm_hook == "fp16":
                self.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif args.comm_hook == "bf16":
                self.register_comm_hook(None, default_hooks.bf16_compress_hook)
            elif args.comm_hook == "powersgd":
                state = powersgd_state(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                       start_powerSGD_iter=args.powersgd_start_iter)
                self.register_comm_hook(state, powersgd.powerSGD_hook)
            if dist.get_rank() == 0:
                rank = f"(r={args.powersgd_rank})" if args.comm_hook == "powersgd" else ""
                print(f"torch_hooks hook={args.comm_hook}{rank}", flush=True)

    return HookedDistributedDataParallel


def main():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--comm-hook", default="allreduce", choices=["allreduce", "fp16", "bf16", "powersgd"])
    parser.add_argument("--powersgd-rank", type=int, default=1)
    parser.add_argument("--powersgd-start-iter", type=int, default=2)
    args, rest = parser.parse_known_args()
    torch.nn.parallel.DistributedDataParallel = hooked_ddp(args)
    sys.argv = [sys.argv[0]] + rest
    reference.main()


if __name__ == "__main__":
    main()
