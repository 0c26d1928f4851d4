"""A user's own DDP loop on gloo with tuner.Probe in it (run under torchrun by the tests).

Writes OUT_DIR/rank<N>.json per rank (argv[1]): the probe's summary and the step times it
measured on this rank.
"""

import gc
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import tuner

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 8192), nn.ReLU(), nn.Linear(8192, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
tail = "--profile-tail" in sys.argv  # the NCCL path's profiled tail, run here on gloo
probe = tuner.Probe(warmup=2, measure=20, comm_profile=True) if tail else tuner.Probe(warmup=2, measure=10)
if "--no-watch" not in sys.argv:
    probe.watch(model)


def batches():
    while True:
        time.sleep(0.003)  # storage latency
        yield torch.randn(8, 32), torch.randint(0, 4, (8,))


tail_steps: list[tuple[float, float]] = []  # (seconds, host-timed exposed comm) of each step after the window
last = time.perf_counter()
for x, y in probe.loader(batches()):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    closed = probe.window_end is not None
    probe.step()
    now = time.perf_counter()
    if closed:
        tail_steps.append((now - last, probe.comm.take()))
    last = now
    if probe.done:
        break
summary = probe.summary()  # a collective: every rank calls it
record = {"summary": summary, "step_times": probe.window.step_times, "samples": probe.window.samples,
          "profiled_comm_share": probe.profiled_comm_share, "steps_done": probe.steps_done,
          "tail_steps": tail_steps}
Path(sys.argv[1], f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
probe.close()
# The DDP model (its reducer, with the probe's comm hook) goes before the process group it
# uses: left to interpreter exit, it was once destroyed after the group and rank 1 aborted
# ("terminate called without an active exception", seen in CI).
del model, optimizer, probe
gc.collect()
dist.barrier()
dist.destroy_process_group()
