"""The measuring harness: where each optimizer step's time goes.

The probe wraps the batch iterator (time blocked in ``next()`` is data wait) and is told
when an optimizer step has finished. It never synchronises the device: on a GPU the step
boundaries are CUDA events read once, after the window. The same object measures the
tuner's own loop and, as ``tuner.Probe``, a loop the tuner does not own::

    probe = tuner.Probe()
    for batch in probe.loader(train_loader):
        ...                      # forward, backward, optimizer.step()
        probe.step()
        if probe.done:
            break
    print(probe.summary())
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Iterator

import psutil
import torch

from tuner.metrics import Window, summarize


class Probe:
    """Times optimizer steps and the data wait inside them.

    Args:
        warmup: steps to skip before measuring.
        measure: steps to measure; ``None`` measures every step after warm-up and
            ``done`` never becomes true.
        device: the training device; CUDA step times come from events on its stream.
        tokens_per_sample: if given, ``tokens_per_s`` is reported.
    """

    def __init__(
        self,
        warmup: int = 0,
        measure: int | None = None,
        device: torch.device | str | None = None,
        tokens_per_sample: int | None = None,
    ) -> None:
        self.warmup = warmup
        self.measure = measure
        self.device = torch.device(device) if device is not None else None
        self.tokens_per_sample = tokens_per_sample
        self.steps_done = 0
        self.window = Window()
        self.window_start: float | None = None
        self.window_end: float | None = None
        self._cuda = self.device is not None and self.device.type == "cuda"
        self._events: list[torch.cuda.Event] = []
        self._wait = 0.0
        self._samples = 0
        self._last = 0.0
        self._cpu_start = 0.0
        self._proc = psutil.Process()

    # --- the loop's side ------------------------------------------------------------------

    def loader(self, iterable: Iterable[Any], transfer: Callable[[Any], Any] | None = None) -> Iterator[Any]:
        """Yield from ``iterable``, timing each ``next()`` (and ``transfer``, the copy to the
        device when it is not overlapped) as data wait."""
        it = iter(iterable)
        while True:
            start = time.perf_counter()
            if self.window_start is None and self.warmup == 0 and self.steps_done == 0:
                self._open_window(start)
            try:
                batch = next(it)
            except StopIteration:
                return
            if transfer is not None:
                batch = transfer(batch)
            self._wait += time.perf_counter() - start
            self._samples += _leading_dim(batch)
            yield batch

    def step(self, samples: int | None = None) -> None:
        """One optimizer step has finished; ``samples`` overrides the inferred count."""
        now = time.perf_counter()
        self.steps_done += 1
        if self.measuring_step:
            w = self.window
            w.step_times.append(now - self._last)
            w.data_waits.append(self._wait)
            w.samples.append(samples if samples is not None else self._samples)
            if self._cuda:
                self._record_event()
            if self.measure is not None and len(w.step_times) == self.measure:
                self._close_window(now)
        elif self.steps_done == self.warmup:
            self._open_window(now)
        self._last = now
        self._wait = 0.0
        self._samples = 0

    @property
    def measuring_step(self) -> bool:
        """Whether the step just counted lies in the measured window."""
        return self.window_start is not None and self.window_end is None

    @property
    def done(self) -> bool:
        """True once the measured window is complete (never, when ``measure`` is None)."""
        return self.window_end is not None

    # --- results --------------------------------------------------------------------------

    def finish(self) -> Window:
        """Close the window (if still open) and return what this rank recorded."""
        if self.window_start is not None and self.window_end is None:
            self._close_window(self._last)
        w = self.window
        if self._cuda and len(self._events) > 1:
            self._events[-1].synchronize()  # after the window: reading events is free then
            w.step_times = [a.elapsed_time(b) / 1000.0 for a, b in zip(self._events, self._events[1:])]
        return w

    def summary(self) -> dict[str, Any]:
        """This process's metrics (DESIGN.md names); ``tuner`` reduces over ranks itself."""
        window = self.finish()
        if not window.step_times:
            raise RuntimeError("the probe has measured no step yet: call probe.step() after each optimizer step")
        return summarize([window], self.tokens_per_sample)

    # --- internals ------------------------------------------------------------------------

    def _open_window(self, now: float) -> None:
        self.window_start = now
        self._last = now
        self._cpu_start = _cpu_seconds(self._proc)
        if self._cuda:
            self._record_event()

    def _close_window(self, now: float) -> None:
        self.window_end = now
        self.window.wall_s = now - (self.window_start or now)
        self.window.cpu_s = _cpu_seconds(self._proc) - self._cpu_start

    def _record_event(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        self._events.append(event)


def _cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _leading_dim(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        return _leading_dim(next(iter(batch.values()), None))
    if isinstance(batch, (list, tuple)) and batch:
        return _leading_dim(batch[0])
    return 0
