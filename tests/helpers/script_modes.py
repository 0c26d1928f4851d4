"""A training script that misbehaves on purpose, chosen by its knobs (script-mode tests).

micro_batch_size 4: raises; num_workers 1: finishes without ever using the probe;
num_workers 2: hangs after a few steps; num_workers 3: every step takes 50x longer (a
configuration the prune rule should cut); otherwise trains and reports normally.
"""

import time

import torch

import tuner

cfg = tuner.config(micro_batch_size=8, global_batch_size=8)
if cfg.micro_batch_size == 4:
    raise ValueError("boom at micro-batch 4")
if cfg.num_workers == 1:
    print("training without the probe")
    raise SystemExit(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
probe = tuner.Probe(warmup=2)
batches = (torch.randn(cfg.micro_batch_size, 8) for _ in range(10_000))
for step, x in enumerate(probe.loader(batches)):
    if cfg.num_workers == 2 and step == 3:
        print("hanging", flush=True)
        time.sleep(3600)
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.1 if cfg.num_workers == 3 else 0.002)
    probe.step()
