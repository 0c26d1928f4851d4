"""An Accelerate script with no tuner code that gets in the way of a knob, chosen by flags
(the adapt: accelerate tests): --explicit-precision passes mixed_precision to Accelerator
itself; --no-accumulate steps on every batch (no accelerator.accumulate); --no-prepare-loader
iterates a DataLoader it never passes through accelerator.prepare."""

import sys

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

flags = set(sys.argv[1:])
accelerator = Accelerator(mixed_precision="no") if "--explicit-precision" in flags else Accelerator()
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(4096, 8), torch.randint(0, 2, (4096,)))
loader = DataLoader(data, batch_size=8, shuffle=True)
if "--no-prepare-loader" in flags:
    model, optimizer = accelerator.prepare(model, optimizer)
else:
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for _epoch in range(100):
    for x, y in loader:
        if "--no-accumulate" in flags:
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        else:
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
