"""An Accelerate training script with no tuner code in it (the zero-change path).

It is written the way Accelerate's examples are: an ``Accelerator()`` that takes mixed
precision and gradient accumulation from ``accelerate launch`` (its environment), the
loader and model through ``accelerator.prepare``, ``accelerator.accumulate`` in the loop.
``recipes/script_accelerate.yaml`` tunes it as it is (``adapt: accelerate``):

    torchrun --nproc_per_node=2 recipes/scripts/train_accelerate.py --steps 100
    python -m tuner.search recipes/script_accelerate.yaml
"""

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from slow_data import SlowReads  # beside this script


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--latency-ms", type=float, default=2.0)
    args = parser.parse_args()

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(SlowReads(4096, args.latency_ms), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    step = 0
    while step < args.steps:
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                if step >= args.steps:
                    break
    accelerator.print(f"trained {step} steps, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
