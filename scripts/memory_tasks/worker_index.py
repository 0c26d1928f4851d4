"""A job whose loader workers each hold their own index (issue 14's example): the first
sample a process reads builds an ``index_mib`` lookup table in that process (as a worker
opening its own LMDB handle, tokenizer cache or shard index does), so every loader worker
adds ``index_mib`` to the process tree's memory. Reads wait ``read_ms`` each (slow
storage), so more workers are faster until the memory budget stops them.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset


class IndexedReads(Dataset):
    def __init__(self, size: int, features: int, index_mib: int, read_ms: float) -> None:
        self.size, self.features, self.index_mib, self.read_s = size, features, index_mib, read_ms / 1000.0
        self.index: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        if self.index is None:  # built in the process that reads: each worker its own
            self.index = torch.arange(self.index_mib * 2**20 // 8, dtype=torch.int64)
        time.sleep(self.read_s)
        g = torch.Generator().manual_seed(int(self.index[i % self.index.numel()]))
        return torch.randn(self.features, generator=g), i % 10


def build_dataset(args: dict) -> Dataset:
    return IndexedReads(args.get("size", 4096), args.get("features", 64), args.get("index_mib", 256),
                        args.get("read_ms", 1.0))


def build_model(args: dict) -> nn.Module:
    width, features = args.get("width", 512), args.get("features", 64)
    return nn.Sequential(nn.Linear(features, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def compute_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
