"""Reference run of Python's torch.amp.GradScaler("cpu") for tests/ddp/test_amp.cpp.

usage: grad_scaler_reference.py OUT.pt

Replays a fixed sequence of "scaled" gradients (random, times the current scale, as the backward of
scaler.scale(loss) gives them; a few hold inf or NaN) through GradScaler + SGD with momentum, with
gradient clipping after unscale_() on some steps, and writes everything the C++ GradScaler must
reproduce into one state dict (name -> tensor; read in C++ with ddp::load_state_dict_file):
  config.*          the scaler's and the optimizer's settings
  init.<i>          the initial parameters
  grad.<k>.<i>      the gradient given to parameter i at step k
  clip.<k>          1: unscale_() then clip_grad_norm_(max_norm) before step(); 0: step() alone
  loss.<k>, scaled_loss.<k>   scaler.scale(loss) on a sample value
  stepped.<k>       1 when the optimizer stepped (no inf/NaN), 0 when skipped
  scale.<k>, tracker.<k>      get_scale() and the growth tracker after update()
  param.<k>.<i>     the parameters after step k
  state.<key>       scaler.state_dict() at the end (Python's keys)
"""
import sys

import torch

STEPS = 14
INF_AT = {4: (0, float("inf")), 8: (1, float("nan")), 9: (0, float("-inf")), 10: (1, float("inf"))}
CLIP_AT = {2, 6, 9, 11}


def main(out):
    torch.manual_seed(1234)
    params = [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    config = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    lr, momentum, max_norm = 0.1, 0.9, 0.5
    scaler = torch.amp.GradScaler("cpu", **config)
    optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum)
    record = {f"config.{k}": torch.tensor(float(v), dtype=torch.float64) for k, v in config.items()}
    record.update({"config.lr": torch.tensor(lr, dtype=torch.float64),
                   "config.momentum": torch.tensor(momentum, dtype=torch.float64),
                   "config.max_norm": torch.tensor(max_norm, dtype=torch.float64)})
    for i, p in enumerate(params):
        record[f"init.{i}"] = p.detach().clone()
    for k in range(STEPS):
        loss = torch.randn(())
        record[f"loss.{k}"] = loss
        record[f"scaled_loss.{k}"] = scaler.scale(loss)
        for i, p in enumerate(params):
            g = torch.randn(p.shape) * scaler.get_scale()
            if k in INF_AT and INF_AT[k][0] == i:
                g.view(-1)[1] = INF_AT[k][1]
            record[f"grad.{k}.{i}"] = g.clone()
            p.grad = g
        clip = k in CLIP_AT
        record[f"clip.{k}"] = torch.tensor(int(clip))
        if clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, max_norm)
        before = [p.detach().clone() for p in params]
        scaler.step(optimizer)
        stepped = any(not torch.equal(b, p.detach()) for b, p in zip(before, params))
        record[f"stepped.{k}"] = torch.tensor(int(stepped))
        scaler.update()
        record[f"scale.{k}"] = torch.tensor(scaler.get_scale(), dtype=torch.float64)
        record[f"tracker.{k}"] = torch.tensor(scaler.state_dict()["_growth_tracker"])
        for i, p in enumerate(params):
            record[f"param.{k}.{i}"] = p.detach().clone()
        optimizer.zero_grad()
    for key, value in scaler.state_dict().items():
        record[f"state.{key}"] = torch.tensor(float(value), dtype=torch.float64)
    torch.save(record, out)


if __name__ == "__main__":
    main(sys.argv[1])
