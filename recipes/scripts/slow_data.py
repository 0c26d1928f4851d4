"""The example scripts' data: samples read from "storage" with a fixed latency each, the
loader-bound case tuning helps most (more loader workers hide the latency)."""

import time

import torch
from torch.utils.data import Dataset


class SlowReads(Dataset):
    """``size`` samples of 64 features and a class out of 10, each read in ``latency_ms``."""

    def __init__(self, size: int, latency_ms: float) -> None:
        self.size, self.latency = size, latency_ms / 1000

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        time.sleep(self.latency)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), i % 10
