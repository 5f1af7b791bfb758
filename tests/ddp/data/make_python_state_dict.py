"""Writes python_ddp_state_dict.pt, the fixture of tests/ddp/test_checkpoint.cpp: what Python's
torch.save(ddp_model.state_dict()) writes for a DistributedDataParallel model (an OrderedDict with
_metadata, keys with the "module." prefix). Run with the venv's python from this folder."""
import torch


class Wrapper(torch.nn.Module):  # stands in for DDP: the model is its child "module"
    def __init__(self):
        super().__init__()
        self.module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))


model = Wrapper()
with torch.no_grad():
    model.module[0].weight.copy_(torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5)
    model.module[0].bias.copy_(torch.tensor([1.0, -1.0]))
    model.module[1].weight.copy_(torch.tensor([2.0, 3.0]))
    model.module[1].bias.copy_(torch.tensor([0.5, 0.25]))
    model.module[1].running_mean.copy_(torch.tensor([0.1, 0.2]))
    model.module[1].running_var.copy_(torch.tensor([1.5, 2.5]))
    model.module[1].num_batches_tracked.fill_(7)
torch.save(model.state_dict(), "python_ddp_state_dict.pt")
