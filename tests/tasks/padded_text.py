"""A text task as users write one: token-id lists of varied length, padded per batch to the
longest in it, each token through a wide MLP (activations grow with the padded length).

task_args: size (samples), short (their length), long (the few long ones' length), every (one
sample in this many is long), width (the MLP's hidden size), step_ms (a fixed wait in each
forward, as a host waits on an accelerator: fewer, larger micro-batches are faster), bad_size
("raise" or "float": a broken ``sample_size``, which otherwise gives a sample's length).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

_bad: str | None = None
_wait_s = 0.0


class Texts(Dataset):
    def __init__(self, size: int, short: int, long: int, every: int) -> None:
        self.size, self.short, self.long, self.every = size, short, long, every

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = self.long if i % self.every == self.every - 1 else self.short
        ids = [(i * 31 + j * 7) % 997 + 1 for j in range(n)]
        return {"input_ids": ids, "label": i % 4}


class Model(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 128, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(128, width), nn.GELU(), nn.Linear(width, 128))
        self.head = nn.Linear(128, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.mlp(self.embed(ids))
        return self.head(h.mean(dim=1))


def build_model(args: dict) -> nn.Module:
    return Model(args.get("width", 1024))


def build_dataset(args: dict) -> Dataset:
    global _bad, _wait_s
    _bad, _wait_s = args.get("bad_size"), args.get("step_ms", 0.0) / 1000

    return Texts(args.get("size", 4000), args.get("short", 16), args.get("long", 2048), args.get("every", 1333))


def collate(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, :len(s["input_ids"])] = torch.tensor(s["input_ids"])
    return {"input_ids": ids, "label": torch.tensor([s["label"] for s in samples])}


def compute_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    time.sleep(_wait_s)
    return nn.functional.cross_entropy(model(batch["input_ids"]), batch["label"])


def sample_size(sample: dict[str, Any]) -> Any:
    if _bad == "raise":
        raise ValueError("no length for this sample")
    if _bad == "float":
        return len(sample["input_ids"]) / 2
    return len(sample["input_ids"])
