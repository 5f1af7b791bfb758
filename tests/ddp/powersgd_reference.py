"""PyTorch's powerSGD_hook on a small MLP, 2 ranks over Gloo: the reference loss curve that
tests/ddp/test_powersgd_reference.cpp compares the C++ PowerSgdHook with (same model, data, seed).

Usage: powersgd_reference.py --out FILE [--steps N] [--rank R] [--start-iter S] [--hook powersgd|allreduce]
Writes {"losses": [[rank 0's loss per step], [rank 1's]]}.
"""
import argparse
import datetime
import json
import multiprocessing
import os
import random
import sys
import tempfile
import types

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

WORLD = 2


class LegacyRandomState:
    """numpy.random.RandomState(seed).randint(high), the one use PowerSGDState makes of numpy, for a
    venv without numpy: the Mersenne Twister seeded as numpy's init_genrand, 32-bit draws masked to
    the bound's bit length and rejected above it (numpy's legacy bounded integers)."""

    def __init__(self, seed):
        state = [seed & 0xFFFFFFFF]
        for i in range(1, 624):
            state.append((1812433253 * (state[-1] ^ (state[-1] >> 30)) + i) & 0xFFFFFFFF)
        self._twister = random.Random()
        self._twister.setstate((3, tuple(state + [624]), None))

    def randint(self, high):
        mask = (1 << (high - 1).bit_length()) - 1
        while True:
            value = self._twister.getrandbits(32) & mask
            if value < high:
                return value


def powersgd_state(**kwargs):
    try:
        import numpy  # noqa: F401  (the real one, when installed)
        return powersgd.PowerSGDState(**kwargs)
    except ImportError:
        pass
    # Only while PowerSGDState is built: torch probes sys.modules["numpy"] elsewhere.
    sys.modules["numpy"] = types.SimpleNamespace(random=types.SimpleNamespace(RandomState=LegacyRandomState))
    try:
        return powersgd.PowerSGDState(**kwargs)
    finally:
        del sys.modules["numpy"]


def build_model():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model


def worker(rank, args, init_file, losses_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    model = DistributedDataParallel(build_model())
    if args.hook == "powersgd":
        state = powersgd_state(process_group=None, matrix_approximation_rank=args.rank,
                               start_powerSGD_iter=args.start_iter, random_seed=0)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(8, 16, generator=data)
        y = torch.randn(8, 4, generator=data)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with open(losses_file, "w") as out:
        json.dump(losses, out)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--start-iter", type=int, default=2)
    parser.add_argument("--hook", choices=["powersgd", "allreduce"], default="powersgd")
    args = parser.parse_args()
    # Rank 0 in this process, rank 1 forked from it: torch is imported once (spawn would import it
    # in every child, which dominates the run time on a loaded machine).
    with tempfile.TemporaryDirectory() as folder:
        init_file = os.path.join(folder, "init")
        files = [os.path.join(folder, f"losses{r}.json") for r in range(WORLD)]
        child = multiprocessing.get_context("fork").Process(target=worker, args=(1, args, init_file, files[1]))
        child.start()
        try:
            worker(0, args, init_file, files[0])
        finally:
            child.join(timeout=120)
            if child.is_alive():
                child.kill()
                child.join()
        if child.exitcode != 0:
            print(f"rank 1 failed (exit code {child.exitcode})", file=sys.stderr)
            return 1
        losses = []
        for name in files:
            with open(name) as f:
                losses.append(json.load(f))
        with open(args.out, "w") as out:
            json.dump({"losses": losses}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
