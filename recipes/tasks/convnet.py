"""A small convolutional image classifier: the levers for convolutional models.

Images are synthetic (seeded per index, as a decoded JPEG would arrive: float, NCHW). Some
samples cost more to prepare than others (``slow_every``, ``slow_ms``: a larger JPEG, a
heavier augmentation), which is what the DataLoader's ``in_order: false`` is for: a slow
batch no longer holds back the ready ones behind it. ``channels_last`` runs the
convolutions in NHWC (oneDNN on a CPU, cuDNN's tensor-core kernels on a GPU);
``cudnn_benchmark`` and ``matmul_precision`` act on a GPU only.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset


class Images(Dataset):
    def __init__(self, size: int, resolution: int, classes: int, slow_every: int, slow_ms: float) -> None:
        self.size, self.resolution, self.classes = size, resolution, classes
        self.slow_every, self.slow_s = slow_every, slow_ms / 1000.0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        if self.slow_every and index % self.slow_every == 0:
            time.sleep(self.slow_s)
        g = torch.Generator().manual_seed(index)
        return torch.rand(3, self.resolution, self.resolution, generator=g), int(index % self.classes)


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(8, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(8, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(x + self.norm2(self.conv2(y)))


class ConvNet(nn.Module):
    def __init__(self, channels: int, depth: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.blocks = nn.Sequential(*(Block(channels) for _ in range(depth)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(torch.relu(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


def build_dataset(args: dict) -> Dataset:
    return Images(size=args.get("size", 4096), resolution=args.get("resolution", 32), classes=args.get("classes", 10),
                  slow_every=args.get("slow_every", 0), slow_ms=args.get("slow_ms", 0.0))


def build_model(args: dict) -> nn.Module:
    return ConvNet(args.get("channels", 32), args.get("depth", 2), args.get("classes", 10))


def compute_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
