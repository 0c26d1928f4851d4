"""Where the probe's clock comes from: the host's, or the device's own timeline.

On a GPU the host runs ahead of the device, so host time in ``next()`` is not all exposed,
and a pageable ``.to("cuda")`` blocks until the previous step's kernels finish: timed on the
host, that reads as input transfer. So the probe marks points and a timing source says what
a mark is: :class:`HostClock` ``time.perf_counter()``, :class:`CudaEvents` an event on the
training stream, where the gap between marks around ``next()`` is the device's idle wait
for the batch. Events are read after the window; inside it only the marks the device has
reached count (:meth:`CudaEvents.reached`). :func:`step_waits` turns marks into each step's
wait and copy for both sources, so a CPU test of it holds for the CUDA path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch

if TYPE_CHECKING:
    from tuner.harness.metrics import Window


class Timing(Protocol):
    """A clock the probe marks points with."""

    deferred: bool
    """True when the seconds between two marks can be read only once the device has
    reached them (CUDA events): the probe reads them after the window."""

    def mark(self) -> Any:
        """A point on the timeline, now (host) or at this place in the stream (device)."""

    def seconds(self, a: Any, b: Any) -> float:
        """Seconds from mark ``a`` to mark ``b`` on the timeline."""

    def host(self, mark: Any) -> float:
        """The host's ``perf_counter()`` when the mark was made (live figures, window edges)."""

    def reached(self, mark: Any) -> bool:
        """Whether the timeline has passed ``mark``, so that :meth:`seconds` may read it now."""

    def wait(self, mark: Any) -> None:
        """Block until the timeline has passed ``mark`` (after the window only)."""


class HostClock:
    """The host's clock: the loop is the device (CPU training)."""

    deferred = False

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, a: float, b: float) -> float:
        return b - a

    def host(self, mark: float) -> float:
        return mark

    def reached(self, mark: float) -> bool:
        return True

    def wait(self, mark: float) -> None:
        pass


class CudaEvents:
    """CUDA events on the device's current stream: the device's own timeline.

    Each mark is the pair (host ``perf_counter()``, event). Recording an event costs a few
    microseconds and never synchronises; :meth:`seconds` must only be asked of completed
    events (after the window, or after :meth:`reached` said so)."""

    deferred = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> tuple[float, Any]:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return time.perf_counter(), event

    def seconds(self, a: tuple[float, Any], b: tuple[float, Any]) -> float:
        return float(a[1].elapsed_time(b[1])) / 1000.0

    def host(self, mark: tuple[float, Any]) -> float:
        return mark[0]

    def reached(self, mark: tuple[float, Any]) -> bool:
        return bool(mark[1].query())

    def wait(self, mark: tuple[float, Any]) -> None:
        """Block until the device has reached ``mark`` (after the window only)."""
        mark[1].synchronize()


def source_for(device: torch.device | None) -> Timing:
    """CUDA events on a CUDA device, else the host clock."""
    if device is not None and device.type == "cuda":
        return CudaEvents(device)
    return HostClock()


@dataclass
class Fetch:
    """One batch handed to the loop: marks before ``next()``, after it, and after the copy
    to the device (``None`` without a copy)."""

    asked: Any
    ready: Any
    copied: Any = None


@dataclass
class Step:
    """One measured optimizer step: its end mark and the batches fetched inside it."""

    end: Any
    fetches: list[Fetch] = field(default_factory=list)
    samples: int = 0


def step_waits(timing: Timing, fetches: Sequence[Fetch]) -> tuple[float, float]:
    """(data wait, copy) seconds of one step: each fetch's wait from asking to the batch
    on the device, and the copies' part of it, summed over the step's micro-batches.

    On the device's timeline the wait of a fetch is the gap the stream sat idle for it;
    on the host's, the time blocked. Only completed marks may be given on a device."""
    wait = copy = 0.0
    for f in fetches:
        end = f.copied if f.copied is not None else f.ready
        wait += timing.seconds(f.asked, end)
        if f.copied is not None:
            copy += timing.seconds(f.ready, f.copied)
    return wait, copy


def settle(timing: Timing, start: Any, steps: Sequence[Step], settled: int, window: "Window", block: bool) -> int:
    """Append to ``window`` the steps from ``settled`` on that the timeline has passed (all
    of them with ``block``, waiting for the device): each step's seconds from the previous
    step's end (the window's opening mark for the first), its data wait and copy, its
    samples. Returns how many steps are settled now. On the host every step is at once."""
    w = window
    while settled < len(steps):
        step = steps[settled]
        if not timing.reached(step.end):
            if not block:
                return settled
            timing.wait(step.end)
        previous = steps[settled - 1].end if settled else start
        wait, copy = step_waits(timing, step.fetches)
        w.step_times.append(timing.seconds(previous, step.end))
        w.data_waits.append(wait)
        w.samples.append(step.samples)
        if any(f.copied is not None for f in step.fetches) or w.transfer_waits is not None:
            if w.transfer_waits is None:
                w.transfer_waits = [0.0] * (len(w.step_times) - 1)
            w.transfer_waits.append(copy)
        settled += 1
    return settled


def samples_in(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        return samples_in(next(iter(batch.values()), None))
    if isinstance(batch, (list, tuple)) and batch:
        return samples_in(batch[0])
    return 0
