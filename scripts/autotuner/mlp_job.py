"""The job both tuners tune in ``scripts/bench_autotuner.py``: a 6-layer MLP (512 wide) on
synthetic samples, trained with DeepSpeed on 2 gloo ranks.

As a tuner task (``task: mlp_job.py``) its functions build the dataset, model and loss;
run as a script it is a plain DeepSpeed training loop the way DeepSpeed's examples are
written (``--deepspeed_config``), which is what DeepSpeed's autotuner launches.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

WIDTH, LAYERS, CLASSES = 512, 6, 10


class Samples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(WIDTH, generator=g), i % CLASSES


def build_dataset(args):
    return Samples()


def build_model(args):
    layers = [m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


def compute_loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x).float(), y)


def build_optimizer(params, args):
    return torch.optim.AdamW(params, lr=1e-4)


def main() -> None:
    import deepspeed

    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=50)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    model = build_model({})
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=build_dataset({}))
    steps = 0
    for batch in loader:
        loss = compute_loss(engine, [t.to(engine.device) for t in batch])
        engine.backward(loss)
        boundary = engine.is_gradient_accumulation_boundary()
        engine.step()
        steps += boundary
        if steps >= args.steps:
            break


if __name__ == "__main__":
    main()
