"""A plain PyTorch DDP training script, started as under torchrun: `ddp_launch --nproc_per_node 2
examples/python/ddp_gloo_train.py` (or `torchrun ...` with the same arguments). Gloo, CPU, a few
steps of a small model on fixed data; prints when the first step is done (for the start-up
measurement in docs/launcher.md) and checks that every rank ends with the same parameters."""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of the data
    for step in range(args.steps):
        inputs = torch.randn(8, 16, generator=generator)
        loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 0:
            print(f"first step done at {time.time():.6f} (rank {rank} of {world}, "
                  f"role {os.environ['ROLE_NAME']})", flush=True)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(gathered[0], g) for g in gathered)
    print(f"rank {rank}: {args.steps} steps, parameters identical on every rank: {same}", flush=True)
    # Every rank done with its collectives before any rank tears Gloo down: a rank whose peer closed
    # its connections mid-teardown can abort ("terminate called without an active exception").
    del model, optimizer
    dist.barrier()
    dist.destroy_process_group()
    # After destroy_process_group, the interpreter's own exit still aborted a rank in about 1 of 8
    # runs on this machine (torch 2.13, "terminate called without an active exception": a thread
    # object of torch's destroyed while joinable during finalisation, after every print above). The
    # work is done and flushed: leave without the finalisers.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if same else 1)


if __name__ == "__main__":
    main()
