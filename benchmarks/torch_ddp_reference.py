"""PyTorch's Python DDP on exactly what `ddp_bench --mode ddp` runs: the examples' models
(examples/models: LeNet padded for 28x28 Fashion-MNIST, ResNet-18 with a 3x3 stem for CIFAR), the same
data, per-rank batch, SGD (lr 0.01, momentum 0.9), warm-up then timed iterations, Gloo on the CPU.
The one Python reference of the project (scripts/bench-vs-pytorch.sh, benchmarks/ddp_compare.sh).
Run under torchrun:

  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 benchmarks/torch_ddp_reference.py --model lenet
  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 benchmarks/torch_ddp_reference.py --model lenet \
      --data fashion-mnist --pipeline dataset      # or --pipeline tensor

Data (--data):
  synthetic      the pool of uint8 batches (see Note [Synthetic data] in benchmarks/scenarios/train.cpp),
                 sliced, converted and normalised per step, as ddp_bench does.
  fashion-mnist  Debian's IDX files (--data-dir), with a DistributedSampler (seed 0, shuffled, set_epoch
                 per epoch) as ddp_bench --data fashion-mnist does, through one of two pipelines:
    --pipeline dataset  what users write (torchvision.datasets.FashionMNIST + transforms.ToTensor() +
                 Normalize + DataLoader): one Python __getitem__ per sample (uint8 -> PIL image ->
                 float / 255 -> normalise) and the default collate. torchvision itself is used when it
                 imports; the venv's torchvision 0.28.0 wheel is a CUDA build whose operators do not load
                 with the CPU torch, so the script then runs an equivalent hand-written Dataset doing the
                 same per-sample steps as torchvision's FashionMNIST.__getitem__ and ToTensor (it says so).
    --pipeline tensor   Python at its best: the whole set as one uint8 tensor, each batch indexed with the
                 sampler's indices, then converted and normalised as one tensor (what the C++ side does).

Prints one line: "torch_ddp model=... data=... world=... batch_per_rank=... threads=... samples_per_s=...
step_ms=... data_ms=..."
"""
import argparse
import gzip
import os
import struct
import sys
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


FASHION_MEAN, FASHION_STD = 0.2860, 0.3530  # examples/data: fashion_mnist_normalization()


def read_idx(path):
    """An IDX file (gzip or plain) as a uint8 tensor, like torchvision's read_sn3_pascalvincent_tensor."""
    for candidate in (path + ".gz", path):
        if os.path.exists(candidate):
            opener = gzip.open if candidate.endswith(".gz") else open
            with opener(candidate, "rb") as f:
                data = f.read()
            break
    else:
        sys.exit(f"torch_ddp_reference: no {path}(.gz): install Debian's dataset-fashion-mnist or pass --data-dir")
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).view(*shape)


class FashionMNISTByHand(torch.utils.data.Dataset):
    """torchvision.datasets.FashionMNIST(train=True, transform=ToTensor() + Normalize) by hand: per
    sample a PIL image from the uint8 array, then ToTensor's steps (np.array, view, permute, float,
    / 255) and Normalize's (sub mean, div std)."""

    def __init__(self, data_dir):
        try:
            from PIL import Image  # noqa: F401
            import numpy  # noqa: F401
        except ImportError as error:
            sys.exit(f"torch_ddp_reference: --pipeline dataset needs Pillow and NumPy in the venv ({error}): "
                     ".venv/bin/pip install pillow numpy, or use --pipeline tensor")
        self.data = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte"))
        self.targets = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte")).long()
        self.mean = torch.tensor([FASHION_MEAN]).view(-1, 1, 1)
        self.std = torch.tensor([FASHION_STD]).view(-1, 1, 1)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        import numpy as np
        from PIL import Image
        img, target = self.data[index], int(self.targets[index])
        pic = Image.fromarray(img.numpy(), mode="L")
        t = torch.from_numpy(np.array(pic, np.uint8, copy=True)).view(pic.size[1], pic.size[0], 1)
        t = t.permute((2, 0, 1)).contiguous().to(dtype=torch.get_default_dtype()).div(255)
        return t.sub_(self.mean).div_(self.std), target


def torchvision_fashion_mnist(data_dir, work_dir):
    """torchvision's own FashionMNIST over the Debian files (it reads <root>/FashionMNIST/raw/ with the
    IDX files uncompressed), or None when torchvision does not import."""
    try:
        import torchvision
        from torchvision import datasets, transforms
    except Exception as error:  # ImportError, or RuntimeError from a CUDA build's operators
        return None, f"torchvision does not import ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
    raw = os.path.join(work_dir, "FashionMNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        target = os.path.join(raw, name)
        if not os.path.exists(target):
            source = os.path.join(data_dir, name)
            opener = gzip.open if os.path.exists(source + ".gz") else open
            with opener(source + ".gz" if os.path.exists(source + ".gz") else source, "rb") as f, open(target, "wb") as out:
                out.write(f.read())
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((FASHION_MEAN,), (FASHION_STD,))])
    return datasets.FashionMNIST(work_dir, train=True, download=False, transform=transform), f"torchvision {torchvision.__version__}"


def endless(make_epoch, sampler):
    """Batches forever: a new epoch (sampler.set_epoch) when one is used up."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from make_epoch()
        epoch += 1


def fashion_batches(args, rank, world):
    """(batch iterator, description) for --data fashion-mnist."""
    from torch.utils.data import DataLoader, DistributedSampler
    if args.pipeline == "tensor":
        images = read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte"))
        labels = read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte")).long()
        images = images.view(-1, 1, images.shape[-2], images.shape[-1])
        sampler = DistributedSampler(range(len(images)), num_replicas=world, rank=rank, shuffle=True, seed=0)

        def epoch():
            order = torch.tensor(list(sampler))
            for s in range(0, len(order), args.batch):
                idx = order[s:s + args.batch]
                yield images[idx].float().div_(255.0).sub_(FASHION_MEAN).div_(FASHION_STD), labels[idx]
        return endless(epoch, sampler), "one uint8 tensor indexed per batch"
    dataset, how = None, ""
    if args.torchvision != "never":
        dataset, how = torchvision_fashion_mnist(args.data_dir, args.work_dir)
    if dataset is None:
        if args.torchvision == "require":
            sys.exit(f"torch_ddp_reference: --torchvision require, but {how}")
        dataset, how = FashionMNISTByHand(args.data_dir), f"hand-written per-sample Dataset (PIL + ToTensor steps); {how or 'torchvision not used'}"
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=args.workers)
    return endless(lambda: iter(loader), sampler), f"per-sample Dataset + DataLoader ({how}), {args.workers} workers"


def synthetic_batches(args, rank):
    cifar = args.model == "resnet18"
    channels, side = (3, 32) if cifar else (1, 28)
    mean, std = (0.4734, 0.2516) if cifar else (0.2860, 0.3530)
    torch.manual_seed(1000 + rank)
    n = args.pool_batches * args.batch
    labels = torch.randint(10, (n,))
    images = (torch.randint(128, (n, channels, side, side)) + labels.view(-1, 1, 1, 1) * 12).to(torch.uint8)
    i = 0
    while True:
        s = (i % args.pool_batches) * args.batch
        yield images[s:s + args.batch].float().div_(255.0).sub_(mean).div_(std), labels[s:s + args.batch]
        i += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="lenet", choices=["lenet", "resnet18"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--pool-batches", type=int, default=8)
    parser.add_argument("--data", default="synthetic", choices=["synthetic", "fashion-mnist"])
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--pipeline", default="dataset", choices=["dataset", "tensor"],
                        help="fashion-mnist: per-sample Dataset + DataLoader, or one tensor indexed per batch")
    parser.add_argument("--torchvision", default="auto", choices=["auto", "never", "require"],
                        help="fashion-mnist --pipeline dataset: use torchvision's FashionMNIST when it imports (auto)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (ddp_bench loads in the training thread)")
    parser.add_argument("--work-dir", default=os.environ.get("TMPDIR", "/tmp") + "/torch_ddp_reference",
                        help="where torchvision gets its raw/ folder of uncompressed IDX files")
    args = parser.parse_args()
    if args.data == "fashion-mnist" and args.model != "lenet":
        parser.error("--data fashion-mnist trains lenet only (1x28x28 images)")
    dist.init_process_group("gloo")  # torchrun applies OMP_NUM_THREADS
    rank, world = dist.get_rank(), dist.get_world_size()
    cifar = args.model == "resnet18"
    if args.data == "synthetic":
        batches, how = synthetic_batches(args, rank), "synthetic"
    else:
        batches, how = fashion_batches(args, rank, world)
    if rank == 0:
        print(f"torch_ddp data pipeline: {how}", flush=True)
    torch.manual_seed(0)
    net = ResNet18() if cifar else LeNet(1, 28)
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dist.barrier()
    steps, data_ms = [], 0.0
    for i in range(args.warmup + args.iters):
        if i == args.warmup:
            start = time.perf_counter()
            data_ms = 0.0
        t0 = time.perf_counter()
        x, y = next(batches)
        data_ms += (time.perf_counter() - t0) * 1e3
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
        data = args.data if args.data == "synthetic" else f"{args.data}/{args.pipeline}"
        print(f"torch_ddp model={args.model} data={data} world={world} batch_per_rank={args.batch} "
              f"threads={torch.get_num_threads()} samples_per_s={world * args.batch * args.iters / elapsed.item():.1f} "
              f"step_ms={steps[len(steps) // 2]:.3f} data_ms={data_ms / args.iters:.3f} final_loss={loss.item():.4f}",
              flush=True)
    dist.barrier()  # no rank tears Gloo down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
