"""A task whose data comes from slow storage: each sample read waits like a network
filesystem or object store would (``read_latency_ms``), then decodes a small feature
vector. With no loader workers the training loop waits for every read; with workers the
reads overlap with each other and with the step, so throughput moves severalfold.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset


class SlowReads(Dataset):
    def __init__(self, size: int, features: int, classes: int, read_latency_ms: float) -> None:
        self.size, self.features, self.classes = size, features, classes
        self.latency = read_latency_ms / 1000.0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(self.latency)  # the read: the process is blocked, not computing
        g = torch.Generator().manual_seed(index)
        x = torch.randn(self.features, generator=g)
        return x, int(index % self.classes)


def build_dataset(args: dict) -> Dataset:
    return SlowReads(
        size=args.get("size", 4096),
        features=args.get("features", 64),
        classes=args.get("classes", 10),
        read_latency_ms=args.get("read_latency_ms", 2.0),
    )


def build_model(args: dict) -> nn.Module:
    width, features = args.get("width", 256), args.get("features", 64)
    return nn.Sequential(
        nn.Linear(features, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, args.get("classes", 10)),
    )


def compute_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
