"""A plain PyTorch training script with no tuner code, configured by its command line the
way reference training scripts are (``adapt: torch`` tests).

    torchrun --nproc_per_node=2 flags_train.py --batch-size 16 --workers 2 --grad-accum-steps 2

--eval-first iterates a validation loader (batches of 3, in order, no optimizer step)
before training; --own-comm-hook registers DDP's fp16-compression hook, as scripts that
compress their gradients do; --no-loader slices batches from a tensor in memory; --latency-ms is each
sample's read time.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Reads(Dataset):
    def __init__(self, size: int, latency_ms: float) -> None:
        self.size, self.latency = size, latency_ms / 1000

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        time.sleep(self.latency)
        sum(range(20_000))  # ~0.5 ms of decoding work: loader workers show CPU time (10 ms ticks)
        return torch.full((32,), float(i % 7)), i % 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--grad-accum-steps", type=int, default=1)
    parser.add_argument("--amp-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--latency-ms", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--size", type=int, default=2048, help="samples per epoch")
    parser.add_argument("--eval-first", action="store_true")
    parser.add_argument("--no-loader", action="store_true")
    parser.add_argument("--own-comm-hook", action="store_true")
    args = parser.parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
        if args.own_comm_hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dtype = getattr(torch, args.amp_dtype)
    if args.eval_first:
        with torch.no_grad():
            for x, _ in DataLoader(Reads(30, 0.0), batch_size=3):
                model(x)
    if args.no_loader:
        xs, ys = torch.randn(4096, 32), torch.randint(0, 10, (4096,))
        batches = ((xs[i:i + args.batch_size], ys[i:i + args.batch_size])
                   for _ in range(args.epochs) for i in range(0, 4096 - args.batch_size, args.batch_size))
    else:
        data = Reads(args.size, args.latency_ms)
        sampler = DistributedSampler(data) if distributed else None
        loader = DataLoader(data, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
                            num_workers=args.workers, drop_last=True)
        batches = (batch for _ in range(args.epochs) for batch in loader)
    for micro, (x, y) in enumerate(batches, start=1):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = nn.functional.cross_entropy(model(x), y) / args.grad_accum_steps
        loss.backward()
        if micro % args.grad_accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
