"""NVTX ranges, so that an Nsight Systems timeline shows the phases of each step.

Off by default: a range costs a few microseconds, which the probe's budget (<= 1% of a
step) can afford, but nobody needs them without a profiler attached. On a build of
PyTorch without CUDA there is no NVTX: asking for it prints one line and changes nothing.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch


def available() -> bool:
    """Whether this PyTorch build has NVTX (a CUDA build)."""
    return hasattr(torch._C, "_nvtx")  # noqa: SLF001 - whether this build has NVTX at all


class Ranges:
    """Push/pop NVTX ranges when enabled and available; a no-op otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and available()
        if enabled and not self.enabled:
            print("tuner: nvtx ranges asked for, but this PyTorch build has no NVTX (no CUDA); "
                  "running without them", file=sys.stderr)

    def push(self, name: str) -> None:
        if self.enabled:
            torch.cuda.nvtx.range_push(name)

    def pop(self) -> None:
        if self.enabled:
            torch.cuda.nvtx.range_pop()

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        self.push(name)
        try:
            yield
        finally:
            self.pop()
