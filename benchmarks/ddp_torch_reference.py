"""PyTorch's Python DDP on the same models, data, batch and optimizer as `ddp_bench throughput`.

Run under torchrun, e.g.
  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 benchmarks/ddp_torch_reference.py --model lenet
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(h.flatten(1))))))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for stage, width in enumerate([64, 128, 256, 512]):
            layers.append(nn.Sequential(BasicBlock(cin, width, 1 if stage == 0 else 2), BasicBlock(width, width, 1)))
            cin = width
        self.layers = nn.ModuleList(layers)
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for layer in self.layers:
            h = layer(h)
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="lenet", choices=["lenet", "resnet18"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    if args.model == "lenet":
        x, y = torch.randn(args.batch, 1, 28, 28), torch.randint(10, (args.batch,))
        net = LeNet()
    else:
        x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(10, (args.batch,))
        net = ResNet18()
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dist.barrier()
    for i in range(args.warmup + args.iters):
        if i == args.warmup:
            start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    world = dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"throughput impl=torch-python-ddp model={args.model} world={world} batch/rank={args.batch} "
              f"threads={torch.get_num_threads()}: {world * args.batch * args.iters / seconds.item():.1f} samples/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
