"""Python's side of benchmarks/gpu_bench.cpp: one GPU, one process, the examples' models (defined in
torch_ddp_reference.py), the same synthetic data resident on the GPU, SGD (lr 0.01, momentum 0.9).
Modes: plain, ddp (DistributedDataParallel over NCCL at world size 1), ddp_view (gradient_as_bucket_view).

  python3 benchmarks/gpu_torch_reference.py --model lenet --batch 64 --warmup 20 --iters 200

Prints one line per mode, in gpu_bench's format ("torch_gpu model=... mode=... it_per_s=... peak_mib=...").
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp_reference import LeNet, ResNet18  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="lenet", choices=["lenet", "resnet18"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--mode", default="plain,ddp,ddp_view")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpu: SKIPPED: no CUDA device")
        sys.exit(77)
    device = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    cifar = args.model == "resnet18"
    channels, side = (3, 32) if cifar else (1, 28)
    mean, std = (0.4734, 0.2516) if cifar else (0.2860, 0.3530)
    torch.manual_seed(1000)
    n = 8 * args.batch
    labels = torch.randint(10, (n,))
    images = (torch.randint(128, (n, channels, side, side)) + labels.view(-1, 1, 1, 1) * 12).to(torch.uint8)
    images, labels = images.to(device), labels.to(device)
    rendezvous = os.path.join(tempfile.mkdtemp(), "rendezvous")
    dist.init_process_group("nccl", init_method="file://" + rendezvous, rank=0, world_size=1)
    for mode in args.mode.split(","):
        torch.manual_seed(0)
        net = (ResNet18() if cifar else LeNet(1, 28)).to(device)
        model = net
        if mode != "plain":
            model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[0],
                                                              gradient_as_bucket_view=mode == "ddp_view")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        grad_mib = sum(p.numel() * p.element_size() for p in net.parameters()) / 2**20
        for i in range(args.warmup + args.iters):
            if i == args.warmup:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                start = time.perf_counter()
            s = (i % 8) * args.batch
            x = images[s:s + args.batch].float().div_(255.0).sub_(mean).div_(std)
            loss = F.cross_entropy(model(x), labels[s:s + args.batch])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        print(f"torch_gpu model={args.model} mode={mode} batch={args.batch} it_per_s={args.iters / seconds:.3f} "
              f"step_ms={1e3 * seconds / args.iters:.3f} peak_mib={peak:.3f} grad_mib={grad_mib:.3f} "
              f"final_loss={loss.item():.4f}", flush=True)
        del model, net, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
