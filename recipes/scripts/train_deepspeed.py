"""A DeepSpeed training script with no tuner code in it (the zero-change path).

Written the way DeepSpeed's examples are: ``--deepspeed_config ds_config.json`` on the
command line, ``deepspeed.initialize``, a DataLoader whose batch is the engine's
micro-batch, ``engine.backward`` / ``engine.step`` on every micro-batch.
``recipes/script_deepspeed.yaml`` tunes it as it is (``adapt: deepspeed``): the trial's
keys are set into its config, its loader is rebuilt with the trial's loader knobs.

    torchrun --nproc_per_node=2 recipes/scripts/train_deepspeed.py --deepspeed_config recipes/scripts/ds_config.json
    python -m tuner.search recipes/script_deepspeed.yaml
"""

import argparse

import deepspeed
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from slow_data import SlowReads  # beside this script


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    print(f"zero stage {engine.zero_optimization_stage()}, bf16 {engine.bfloat16_enabled()}, micro-batch "
          f"{engine.train_micro_batch_size_per_gpu()}, accumulation {engine.gradient_accumulation_steps()}", flush=True)
    data = SlowReads(4096, args.latency_ms)
    loader = DataLoader(data, batch_size=engine.train_micro_batch_size_per_gpu(), drop_last=True,
                        sampler=DistributedSampler(data))
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    step = 0
    while step < args.steps:
        for x, y in loader:
            x = x.to(engine.device, dtype)
            loss = nn.functional.cross_entropy(engine(x).float(), y.to(engine.device))
            engine.backward(loss)
            boundary = engine.is_gradient_accumulation_boundary()
            engine.step()
            if boundary:
                step += 1
                if step >= args.steps:
                    break


if __name__ == "__main__":
    main()
