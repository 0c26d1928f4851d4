"""The pipeline bubble: how long each stage of this rank sits idle inside its pipeline steps.

Each pipeline step (the schedule's ``step``) is timed, and inside it the stage's own work
(``PipelineStage.forward_one_chunk`` and ``backward_one_chunk``, what the schedule calls
per micro-batch); the bubble is the step's time the stage spent not computing: waiting
for the previous stage's activations or the next one's gradients, and the sends. On a
CPU the host clock is the device's. On a GPU the host only queues kernels, so each span
is a pair of CUDA events on the current stream, read once, after the window (reading
them inside it would synchronise the device every micro-batch). The theory it checks,
for GPipe and 1F1B with ``m`` micro-batches on ``p`` stages: ``(p - 1) / (m + p - 1)``.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch

CHUNKS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
"""What a stage computes per micro-batch (torch.distributed.pipelining's stage methods)."""


class PipelineClock:
    """Pipeline steps and the stage work inside them, by host end time (to keep the window's)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.steps: list[tuple[float, Any, Any]] = []
        """(host end, start, end): seconds on a CPU, CUDA events on a GPU."""
        self.busy: list[tuple[float, Any, Any]] = []

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _span(self, into: list[tuple[float, Any, Any]], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = self._mark()
        try:
            return fn(*args, **kwargs)
        finally:
            into.append((time.perf_counter(), start, self._mark()))

    def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one pipeline step, timed."""
        return self._span(self.steps, fn, *args, **kwargs)

    def watch(self, stage: Any) -> None:
        """Time the stage's per-micro-batch work (its methods, on this instance only)."""
        for name in CHUNKS:
            method = getattr(stage, name, None)
            if method is not None:
                setattr(stage, name, functools.partial(self._span, self.busy, method))

    def idle_s(self, start: float, end: float) -> float:
        """Seconds of the pipeline steps that ended in ``[start, end]`` this rank's stages
        spent not computing (the device is synchronised once, here, on a GPU)."""
        if self.cuda:
            torch.cuda.synchronize()
        total = sum(self._seconds(a, b) for t, a, b in self.steps if start <= t <= end)
        busy = sum(self._seconds(a, b) for t, a, b in self.busy if start <= t <= end)
        return max(0.0, total - busy)

    def _seconds(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1000.0 if self.cuda else b - a
