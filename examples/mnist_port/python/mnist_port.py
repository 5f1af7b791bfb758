# mnist_serial.py ported to PyTorch's DDP as PyTorch's tutorials do it (run with torchrun); each
# change is marked "# ddp:". Compare with examples/mnist_port/mnist_port.cpp (docs/benchmarks.md).
import torch
import torch.distributed as dist  # ddp: added
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP  # ddp: added
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler  # ddp: added

DATA_ROOT = "./data"
TRAIN_BATCH_SIZE = 64
TEST_BATCH_SIZE = 1000
NUMBER_OF_EPOCHS = 3
LOG_INTERVAL = 10


def read_idx(path, magic):
    with open(path, "rb") as f:
        raw = f.read()
    assert int.from_bytes(raw[:4], "big") == magic, path
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(magic & 0xFF)]
    return torch.frombuffer(bytearray(raw[4 + 4 * len(dims):]), dtype=torch.uint8).reshape(dims)


def mnist_files(root, train):
    prefix = root + ("/train" if train else "/t10k")
    images = read_idx(prefix + "-images-idx3-ubyte", 0x803).float().div_(255).unsqueeze(1)
    targets = read_idx(prefix + "-labels-idx1-ubyte", 0x801).long()
    return TensorDataset((images - 0.1307) / 0.3081, targets)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, 5)
        self.conv2 = nn.Conv2d(10, 20, 5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, p=0.5, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def train(epoch, model, device, data_loader, optimizer, dataset_size):
    model.train()
    for batch_idx, (data, targets) in enumerate(data_loader):
        data, targets = data.to(device), targets.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), targets)
        loss.backward()
        optimizer.step()
        if batch_idx % LOG_INTERVAL == 0:
            print(f"\rTrain Epoch: {epoch} [{(batch_idx + 1) * len(data):5}/{dataset_size:5}] Loss: {loss.item():.4f}", end="")


def test(model, device, data_loader, dataset_size):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, targets in data_loader:
            data, targets = data.to(device), targets.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, targets, reduction="sum").item()
            correct += output.argmax(1).eq(targets).sum().item()
    print(f"\nTest set: Average loss: {test_loss / dataset_size:.4f} | Accuracy: {correct / dataset_size:.3f}")


def main():
    dist.init_process_group("gloo")  # ddp: added
    torch.manual_seed(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net().to(device)
    ddp_model = DDP(model)  # ddp: added
    train_dataset = mnist_files(DATA_ROOT, train=True)
    sampler = DistributedSampler(train_dataset)  # ddp: added
    train_loader = DataLoader(train_dataset, batch_size=TRAIN_BATCH_SIZE, sampler=sampler)  # ddp: was no sampler
    test_dataset = mnist_files(DATA_ROOT, train=False)
    test_loader = DataLoader(test_dataset, batch_size=TEST_BATCH_SIZE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for epoch in range(1, NUMBER_OF_EPOCHS + 1):
        sampler.set_epoch(epoch)  # ddp: added
        train(epoch, ddp_model, device, train_loader, optimizer, len(train_dataset))  # ddp: was model
        test(model, device, test_loader, len(test_dataset))


if __name__ == "__main__":
    main()
