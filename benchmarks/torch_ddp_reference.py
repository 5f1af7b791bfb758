"""PyTorch's Python DDP on exactly what `ddp_bench --mode ddp` runs: the examples' models
(examples/models: LeNet padded for 28x28 Fashion-MNIST, ResNet-18 with a 3x3 stem for CIFAR), the same
synthetic data (Note [Synthetic data] in benchmarks/scenarios/train.cpp), per-rank batch, SGD
(lr 0.01, momentum 0.9), warm-up then timed iterations, Gloo on the CPU. Run under torchrun:

  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 benchmarks/torch_ddp_reference.py --model lenet

Prints one line: "torch_ddp model=... world=... batch_per_rank=... threads=... samples_per_s=... step_ms=..."
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class LeNet(nn.Module):
    def __init__(self, in_channels, image_size):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=(32 - image_size) // 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


def conv3x3(cin, cout, stride):
    return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = conv3x3(cout, cout, 1), nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.shortcut(x) if len(self.shortcut) else x))


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.stem_bn = conv3x3(3, 64, 1), nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for width in (64, 128, 256, 512):
            blocks += [BasicBlock(cin, width, 1 if width == 64 else 2), BasicBlock(width, width, 1)]
            cin = width
        self.stages = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem(x)))
        x = self.stages(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="lenet", choices=["lenet", "resnet18"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--pool-batches", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")  # torchrun applies OMP_NUM_THREADS
    rank, world = dist.get_rank(), dist.get_world_size()
    cifar = args.model == "resnet18"
    channels, side = (3, 32) if cifar else (1, 28)
    mean, std = (0.4734, 0.2516) if cifar else (0.2860, 0.3530)
    torch.manual_seed(1000 + rank)
    n = args.pool_batches * args.batch
    labels = torch.randint(10, (n,))
    images = (torch.randint(128, (n, channels, side, side)) + labels.view(-1, 1, 1, 1) * 12).to(torch.uint8)
    torch.manual_seed(0)
    net = ResNet18() if cifar else LeNet(1, 28)
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dist.barrier()
    steps = []
    for i in range(args.warmup + args.iters):
        if i == args.warmup:
            start = time.perf_counter()
        t0 = time.perf_counter()
        s = (i % args.pool_batches) * args.batch
        x = images[s:s + args.batch].float().div_(255.0).sub_(mean).div_(std)
        y = labels[s:s + args.batch]
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
        print(f"torch_ddp model={args.model} world={world} batch_per_rank={args.batch} threads={torch.get_num_threads()} "
              f"samples_per_s={world * args.batch * args.iters / elapsed.item():.1f} step_ms={steps[len(steps) // 2]:.3f} "
              f"final_loss={loss.item():.4f}", flush=True)
    dist.barrier()  # no rank tears Gloo down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
