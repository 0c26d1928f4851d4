"""Levers that are settings of the whole process (``stage: process`` in the registry):
held for one trial and put back after it, so the next trial in the same process starts
from what the job had (a search runs every trial in one process).

- ``matmul_precision``: ``torch.set_float32_matmul_precision``. ``high`` lets fp32
  matmuls run on TF32 tensor cores (Ampere and newer; 8x an A100's fp32 peak on paper),
  ``medium`` also on bf16 where a fast kernel exists; the precision guard checks the loss.
- ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark``: cuDNN times its convolution
  algorithms on the first call of each input shape and keeps the fastest; the timing runs
  in the warm-up, outside the window, as long as the shapes do not change.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from tuner.inputs.levers import LEVERS

if TYPE_CHECKING:
    from tuner.inputs.space import Config

Restore = Callable[[], None]


def matmul_precision(value: str) -> Restore:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    return lambda: torch.set_float32_matmul_precision(before)


def cudnn_benchmark(value: bool) -> Restore:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = bool(value)
    return lambda: setattr(torch.backends.cudnn, "benchmark", before)


def resolve(reference: str) -> Callable[..., Any]:
    """A lever's ``apply`` (``module:function``) as the object it names."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def set_process_levers(values: dict[str, Any], only: Any = None) -> list[Restore]:
    """Set every process-wide lever (those in ``only``, when given) to ``values``'; returns
    how to put each back."""
    return [resolve(lever.applied.function)(values[name]) for name, lever in LEVERS.items()
            if lever.applied.stage == "process" and (only is None or name in only)]


@contextlib.contextmanager
def held(config: "Config") -> Iterator[None]:
    """The trial's process-wide levers for the duration of the block, then the process's own."""
    restores: list[Restore] = []
    try:
        restores = set_process_levers(config.params())
        yield
    finally:
        for restore in reversed(restores):
            restore()
