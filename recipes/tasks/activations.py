"""A test task whose activations dominate its memory: a residual stack of very wide MLP
blocks on a narrow stream (``layers`` x Linear(dim, hidden) -> GELU -> Linear(hidden, dim)),
whose weights are re-derived at every forward (``dequant``, as a quantized model's are
dequantized), so that small micro-batches pay that cost many times per step.

Why this shape, on a CPU where the ruler is the process tree's PSS: glibc puts a freed
allocation below its dynamic mmap threshold (which rises to 32 MiB after large frees)
back on the heap, where fragmentation keeps it resident. With 4 MiB activations (hidden
2048) full checkpointing at micro-batch 512 read 477 MiB of max RSS against 501 without
it, though it frees ~110 MiB of live tensors (358 vs 468 with the threshold fixed at 64
KiB; fixing it for trials halves the large micro-batch's speed with page faults, so the
tuner does not). At hidden 32768 each activation is 32 MiB at micro-batch 256, always
mmap'd and returned on free, so PSS follows what is alive. Measured here (2 cores; dim 8,
hidden 32768, layers 4, dequant 8, global batch 256): micro-batch 16 0.56 GiB / 485
samples/s, 256 0.81 GiB / 1,034, 256 with every block checkpointed 0.51 GiB / 762.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


class Block(nn.Module):
    """An MLP block whose weights are re-derived at every forward (``dequant``), as a
    quantized model's are dequantized: a cost per micro-batch that does not shrink with it."""

    def __init__(self, dim: int, hidden: int, dequant: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dequant = dequant

    def _weight(self, w: torch.Tensor) -> torch.Tensor:
        for _ in range(self.dequant):
            w = w * torch.sigmoid(w)
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(nn.functional.linear(x, self._weight(self.up.weight), self.up.bias))
        return x + nn.functional.linear(h, self._weight(self.down.weight), self.down.bias)


class Stack(nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int, dequant: int = 0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, hidden, dequant) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class Cached(Dataset):
    """Samples already in memory: the data pipeline is not what this task is about."""

    def __init__(self, size: int, dim: int) -> None:
        self.x = torch.randn(size, dim, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.x[index]


def build_model(args: dict) -> nn.Module:
    return Stack(args.get("dim", 32), args.get("hidden", 2048), args.get("layers", 16), args.get("dequant", 0))


def build_dataset(args: dict) -> Dataset:
    return Cached(args.get("size", 4096), args.get("dim", 32))


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).pow(2).mean()
