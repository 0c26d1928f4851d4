"""A task whose ranking is known in advance: each step waits a fixed time on the host, as
a host waits on an accelerator, and the configuration sets how long.

step_ms: the wait of one fp32 micro-batch; bf16_gain: the share of it bf16 saves (0.05:
bf16 is worth 5%). Nothing else changes the step's cost: the optimizer's implementation,
say, is worth 0% (its work on this 4 x 32 model is microseconds against a 20 ms wait). The
arithmetic runs outside autocast, so bf16 changes the wait and nothing else (with autocast
on, bf16's casts cost this CPU more than the wait it saves).
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

_wait_s = {"fp32": 0.01, "bf16": 0.0095}


def build_dataset(args):
    step = args.get("step_ms", 10.0) / 1000.0
    _wait_s.update(fp32=step, bf16=step * (1 - args.get("bf16_gain", 0.05)))
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(4096, 32, generator=g), torch.randn(4096, 4, generator=g))


def build_model(args):
    return nn.Linear(32, 4)


def compute_loss(model, batch):
    bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    time.sleep(_wait_s["bf16" if bf16 else "fp32"])
    x, y = batch
    with torch.autocast("cpu", enabled=False):  # the same arithmetic in every configuration
        return nn.functional.mse_loss(model(x), y)
