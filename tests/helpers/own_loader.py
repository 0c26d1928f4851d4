"""A script that takes its micro-batch from the tuner but builds its DataLoader with its own
loader settings (no workers, whatever the trial says): what a script copied from a tutorial
does. Its trials must record the loader that ran, not the trial's knobs."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import tuner


class Slow(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.0005)
        return torch.randn(16), i % 4


cfg = tuner.config(num_workers=0, micro_batch_size=8, global_batch_size=8)
model = nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Slow(), batch_size=cfg.micro_batch_size, num_workers=0)  # its own: no workers
probe = tuner.Probe()
for x, y in probe.loader(loader):
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    probe.step()
    if probe.done:
        break
probe.close()
