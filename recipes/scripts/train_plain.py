"""A plain PyTorch training script, tuned without restructuring it (script mode).

Two lines make it tunable: its knobs come from ``tuner.config`` (its own defaults outside
the tuner) and its loop goes through ``tuner.Probe``. It runs as it is in production:

    torchrun --nproc_per_node=2 recipes/scripts/train_plain.py --steps 100
    python -m tuner.search recipes/script_plain.yaml          # the tuner launches it per trial
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

import tuner

from slow_data import SlowReads  # beside this script


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    args = parser.parse_args()
    distributed = "WORLD_SIZE" in __import__("os").environ
    if distributed:
        dist.init_process_group("gloo")
    cfg = tuner.config(num_workers=0, micro_batch_size=16, global_batch_size=32)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    if distributed and dist.get_world_size() > 1:
        model = nn.parallel.DistributedDataParallel(model, **cfg.ddp_kwargs())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = SlowReads(4096, args.latency_ms)
    sampler = DistributedSampler(data) if distributed else None
    loader = DataLoader(data, sampler=sampler, drop_last=True, **cfg.dataloader_kwargs())
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.amp_dtype)

    probe = tuner.Probe(warmup=5)
    if isinstance(model, nn.parallel.DistributedDataParallel):
        probe.watch(model)  # time DDP's all-reduces (exposed communication)
    step = micro = 0
    while step < args.steps:
        for x, y in probe.loader(loader):
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(x), y) / cfg.grad_accum_steps
            loss.backward()
            micro += 1
            if micro % cfg.grad_accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
                probe.step()
                step += 1
                if probe.done or step >= args.steps:
                    break
        if probe.done:
            break
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
