"""The measuring harness: where each optimizer step's time goes.

The probe wraps the batch iterator (time blocked in ``next()`` is data wait) and is told
when an optimizer step has finished. It never synchronises the device: on a GPU the step
boundaries are CUDA events read after the window. The same object measures the tuner's own
loop and, as ``tuner.Probe``, a user's loop; what happens when a step is counted or the
window closes (script mode's report) is a hook from the layer above.

Under torchrun every rank runs its own probe, and :meth:`summary` is a collective returning
all ranks' metrics combined. On gloo, time blocked on collectives is exposed communication.
"""

from __future__ import annotations

import collections
import contextlib
import time
from typing import Any, Callable, Iterable, Iterator

import psutil
import torch

from tuner.harness import distributed
from tuner.harness.comm import CommTimer, on_device, watch
from tuner.harness.comm_tail import CommTail
from tuner.harness.metrics import Window, summarize
from tuner.harness.nvtx import Ranges
from tuner.harness.system import energy
from tuner.harness.system.devices import cuda_index
from tuner.harness.system.monitors import WindowMonitors, children_cpu, cpu_seconds
from tuner.harness.timing import Fetch, Step, Timing, samples_in, settle, source_for
from tuner.stats.window_length import AUTO, Auto

RECENT_STEPS = 100  # steps the live view (Prometheus) summarises

MEMORY_INTERVAL_S = 1.0
"""How often the probe samples the process tree's PSS: each sample costs the kernel a few
milliseconds per process (it walks the page tables), so once a second keeps the probe
under 1% of the loop; the window's first and last moments are sampled too."""


class ProbeCore:
    """Times optimizer steps and the data wait inside them.

    Args:
        warmup: steps to skip before measuring.
        measure: steps to measure; ``"auto"``: until samples/s is known (:mod:`tuner.stats.window_length`);
            ``None``: every step after warm-up (``done`` never becomes true).
        device: the training device; CUDA step times come from events on its stream.
        tokens_per_sample: if given, ``tokens_per_s`` is reported.
        flops_per_sample: forward + backward FLOPs of one sample (see
            :func:`tuner.harness.system.flops.count_flops`); gives ``achieved_tflops``, and ``mfu`` on a
            GPU of the peak table.
        amp_dtype: the dtype the matmuls run in (``fp32``, ``bf16``, ``fp16``), for the peak.
        nvtx: mark data wait and steps as NVTX ranges (for Nsight Systems).
        collectives: time the Python-level collectives under a process group of more than
            one rank (the tuner's own loop times its engine's collectives itself).
        comm: the timer to read exposed collective time from (default: the probe's own).
        monitors: sample host memory (PSS of the process tree) and NVML over the window in
            a background thread, for ``peak_mem_gib``, ``host_mem_gib`` and ``gpu_util``
            (the tuner's trial runs its own over the whole trial).
        energy_counter: read the node's energy counters at the window's ends (``energy_j_per_sample``).
        comm_profile: profile a short tail after the window for ``comm_share`` (:mod:`tuner.harness.comm_tail`;
            default: where the host cannot time collectives, CUDA with several ranks); ``done`` waits for it.
        on_step: called after each counted step with (steps done, samples in it).
        on_close: called with the probe when the measured window closes.
        reset_peaks: reset the CUDA peak-memory counters when the window opens (the tuner's
            trial; a user's probe leaves them alone).
        timing: the clock (default: CUDA events on a CUDA device, else the host's).
    """

    def __init__(
        self,
        warmup: int = 0,
        measure: int | str | None = None,
        device: torch.device | str | None = None,
        tokens_per_sample: int | None = None,
        *,
        flops_per_sample: float | None = None,
        amp_dtype: str = "fp32",
        nvtx: bool = False,
        collectives: bool = True,
        comm: CommTimer | None = None,
        monitors: bool = True,
        energy_counter: bool = True,
        comm_profile: bool | None = None,
        on_step: Callable[[int, int], None] | None = None,
        on_close: Callable[["ProbeCore"], None] | None = None,
        reset_peaks: bool = True,
        timing: Timing | None = None,
        device_later: Callable[[], torch.device | None] | None = None,
    ) -> None:
        if warmup < 0 or not (measure is None or measure == "auto" or (isinstance(measure, int) and measure >= 1)):
            raise ValueError(f"warmup must be >= 0 and measure >= 1, 'auto' or None, got {warmup} and {measure!r}")
        self.warmup = warmup
        self.measure = measure
        self._auto: Auto | None = AUTO if measure == "auto" else None
        self._check = AUTO.min_steps
        self.device = cuda_index(device)
        self._reset_peaks = reset_peaks  # the tuner's trial; a user's probe leaves the counters alone
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_sample = flops_per_sample
        self.amp_dtype = amp_dtype
        self.steps_done = 0
        self.window = Window()
        self.window_start: float | None = None
        self.window_end: float | None = None
        self.comm = comm if comm is not None else CommTimer()
        """Exposed collective time; the window records it per step when :attr:`timing_comm`."""
        self.timing_comm = False
        self.total_samples = 0
        self.total_wait = 0.0
        self.recent: collections.deque[tuple[float, float, int]] = collections.deque(maxlen=RECENT_STEPS)
        """(step seconds, data-wait seconds, samples) of the latest steps, for the live view."""
        self._timing: Timing = timing if timing is not None else source_for(self.device)
        """Marks on the host clock, or on the device's stream (:mod:`tuner.harness.timing`)."""
        self._steps: list[Step] = []
        """The measured steps not yet read into the window, and the last one read (whose end
        the next step's time starts from): a step read is let go, its CUDA events with it."""
        self._settled = 0
        self._read = 0
        """Steps read into the window and let go."""
        self._start_mark: Any = None
        self._fetches: list[Fetch] = []
        self._wait = 0.0
        self._samples = 0
        self._last = time.perf_counter()
        self._cpu_start = 0.0
        self._workers_start: dict[int, float] = {}
        self._proc = psutil.Process()
        self._nvtx = Ranges(nvtx)
        self._nvtx_step = False
        self._collectives = collectives
        self._patches: contextlib.ExitStack | None = None
        self._watched: list[str] = []
        self._monitors = monitors
        self._energy_on = energy_counter
        self._comm_profile = comm_profile
        self._tail: CommTail | None = None
        self.profiled_comm_share: float | None = None  # comm_share as the tail's profile read it
        self._sampling: WindowMonitors | None = None
        self._energy: energy.Energy | None = None
        self._on_step, self._on_close = on_step, on_close
        self._device_later = device_later
        """Asked once, at the loop's first batch or step, for the device it trains on: a probe
        made before the script's ``set_device`` learns its rank's device there."""

    def _resolve_device(self) -> None:
        if self._device_later is None:
            return
        ask, self._device_later = self._device_later, None
        device = ask()
        if device is not None and cuda_index(device) != self.device and self.window_start is None:
            self.use_device(device)

    # --- the loop's side ------------------------------------------------------------------

    def loader(self, iterable: Iterable[Any], transfer: Callable[[Any], Any] | None = None) -> Iterator[Any]:
        """Yield from ``iterable``, timing each ``next()`` (and ``transfer``, the copy to the
        device) as data wait: on a GPU, as the gap the device sat idle for the batch
        (:mod:`tuner.harness.timing`)."""
        self._resolve_device()
        it = iter(iterable)
        nvtx = self._nvtx
        if self.steps_done == 0:
            self._last = time.perf_counter()  # the first step starts here, not at construction
        if nvtx.enabled and self.steps_done == 0 and not self._nvtx_step:
            nvtx.push("step 1")
            self._nvtx_step = True
        while True:
            asked = self.mark()
            nvtx.push("data wait")
            try:
                batch = next(it)
            except StopIteration:
                nvtx.pop()
                return
            ready = self._timing.mark()
            copied = None
            if transfer is not None:
                batch = transfer(batch)
                copied = self._timing.mark()
            nvtx.pop()
            self._fetched(Fetch(asked, ready, copied), samples_in(batch))
            yield batch

    def mark(self) -> Any:
        """A point on the probe's timeline, for a loop that fetches its batches itself: make
        one before fetching (or at the end of the previous batch) and give it to
        :meth:`record_fetch` with the batch."""
        self._resolve_device()
        if self.window_start is None and self.warmup == 0 and self.steps_done == 0:
            return self._open_window()
        return self._timing.mark()

    def record_fetch(self, asked: Any, batch: Any = None) -> None:
        """For loops whose iterator the probe cannot wrap (trainer callbacks): the batch asked
        for at the :meth:`mark` ``asked`` is here now (its leading dimension counts as
        samples)."""
        self._fetched(Fetch(asked, self._timing.mark()), samples_in(batch) if batch is not None else 0)

    def _fetched(self, fetch: Fetch, samples: int) -> None:
        timing = self._timing
        end = fetch.copied if fetch.copied is not None else fetch.ready
        self._wait += timing.host(end) - timing.host(fetch.asked)  # the live figures' host clock
        self._fetches.append(fetch)
        self._samples += samples

    def step(self, samples: int | None = None) -> None:
        """One optimizer step has finished; ``samples`` overrides the inferred count."""
        self._resolve_device()
        end = self._timing.mark()
        now = self._timing.host(end)
        self.steps_done += 1
        n = samples if samples is not None else self._samples
        if self._on_step is not None:
            self._on_step(self.steps_done, n)
        elapsed = now - self._last
        if self._tail is not None and self._tail.step():
            self._tail_done()
        if self.measuring_step:
            self._steps.append(Step(end, self._fetches, n))
            if self.window.comm_waits is not None:
                self.window.comm_waits.append(self.comm.take())
            self._settle(block=False)
            if self._window_complete(self.measured):
                self._close_window(now)
        elif self.steps_done == self.warmup:
            now = self._timing.host(self._open_window())
        self.recent.append((elapsed, self._wait, n))
        self.total_samples += n
        self.total_wait += self._wait
        if self._nvtx.enabled:
            if self._nvtx_step:
                self._nvtx.pop()
            self._nvtx.push(f"step {self.steps_done + 1}")
            self._nvtx_step = True
        self._last = now
        self._wait = 0.0
        self._fetches = []
        self._samples = 0

    @property
    def measured(self) -> int:
        """Steps counted inside the window so far (some maybe not yet reached by the device)."""
        return self._read + len(self._steps)

    def _settle(self, block: bool) -> None:
        """Move the measured steps the timeline has passed into the window (all of them
        with ``block``, after the window): on a GPU, decisions inside the window use only
        what the device has done (:func:`tuner.harness.timing.settle`)."""
        self._settled = settle(self._timing, self._start_mark, self._steps, self._settled, self.window, block)
        if self._settled > 1:  # keep the last read step: the next one is timed from its end
            gone = self._settled - 1
            del self._steps[:gone]
            self._read += gone
            self._settled = 1

    def watch(self, model: Any) -> Any:
        """Time the collectives a wrapped model runs: a DDP model's gradient all-reduces
        (through a communication hook; call before its first backward) or a DeepSpeed
        engine's (``deepspeed.comm``, while the window is open). Returns ``model``. On NCCL
        the probe attaches nothing: a model's own communication hook keeps working."""
        self._watched.append(watch(model, self.comm))
        return model

    def close(self) -> None:
        """Stop the samplers, the collective timing and a profiled tail, whichever run."""
        self._unpatch()
        self._stop_monitors()
        if self._tail is not None:
            self._tail.close()

    def use_device(self, device: torch.device | str) -> None:
        """The training device, for a probe made before it was known; before the window opens."""
        if self.window_start is not None:
            raise RuntimeError("use_device() must come before the measured window opens")
        self.device = cuda_index(device)
        self._timing = source_for(self.device)
        self._fetches = []  # warm-up batches, marked on the clock before

    @property
    def nvtx(self) -> Ranges:
        """The probe's NVTX ranges (no-ops unless asked for), for a loop marking its own phases."""
        return self._nvtx

    @property
    def measuring_step(self) -> bool:
        """Whether the step just counted lies in the measured window."""
        return self.window_start is not None and self.window_end is None

    @property
    def done(self) -> bool:
        """True once the measured window is complete (never, when ``measure`` is None)."""
        return self.window_end is not None and self._tail is None

    # --- results --------------------------------------------------------------------------

    def finish(self) -> Window:
        """Close the window (if still open) and return what this rank recorded: on a GPU,
        once the device has run every measured step (reading the events is free then)."""
        if self.window_start is not None and self.window_end is None:
            self._close_window(self._last)
        self._settle(block=True)
        return self.window

    def summary(self) -> dict[str, Any]:
        """The metrics (DESIGN.md names). Under a process group of several ranks this is a
        collective: call it on every rank; each gets the metrics of all ranks combined."""
        from tuner.harness.system.flops import peak_flops

        window = self.finish()
        windows = distributed.all_gather(window)
        if not all(w.step_times for w in windows):
            raise RuntimeError("the probe has measured no step yet: call probe.step() after each optimizer step")
        peak = peak_flops(self.device, self.amp_dtype) if self.device is not None else None
        return summarize(windows, self.tokens_per_sample, self.flops_per_sample, peak)

    # --- internals ------------------------------------------------------------------------

    def _window_complete(self, n: int) -> bool:
        """A fixed count reached, or (``auto``) rank 0's window stable at a check step
        (every rank asks at the same step; rank 0's answer is everyone's)."""
        if self._auto is None or n < self._check:
            return self._auto is None and isinstance(self.measure, int) and n == self.measure
        self._check = self._auto.next_check(n)
        return bool(distributed.broadcast(self._auto.enough(self.window.step_times)))

    def _open_window(self) -> Any:
        """The monitors first, then the clock; their start-up is the tuner's work (it was
        5.9 ms of the first measured step). Returns the window's opening mark."""
        self.comm.take()
        if not distributed.several_ranks():
            self.window.comm_share = 0.0  # nobody to talk to
        elif not on_device(self.device):  # gloo's collectives: the host's clock sees them
            self.window.comm_waits = []
            self._patch()
        if self._monitors:
            self._sampling = WindowMonitors(self.device, MEMORY_INTERVAL_S, self._reset_peaks)
        self._energy = energy.reader_for(self.device).started() if self._energy_on else None
        self._cpu_start = cpu_seconds(self._proc)
        self._workers_start = children_cpu(self._proc)
        self._start_mark = mark = self._timing.mark()
        self.window_start = self._last = self._timing.host(mark)
        return mark

    def _stop_monitors(self) -> None:
        if self._energy is not None:
            reader, self._energy = self._energy, None
            self.window.energy_j = reader.stop()
            self.window.energy_key, self.window.energy_why = reader.key, reader.why
        if self._sampling is not None:
            self._sampling.stop(self.window, self.window_start or 0.0)
            self._sampling = None

    def _close_window(self, now: float) -> None:
        self.window_end = now
        self.window.wall_s = now - (self.window_start or now)
        self.window.cpu_s = cpu_seconds(self._proc) - self._cpu_start
        self.window.worker_cpu_s = sum(
            max(0.0, cpu - self._workers_start.get(pid, 0.0)) for pid, cpu in children_cpu(self._proc).items()
        )
        self._unpatch()
        self._stop_monitors()
        if self._collectives and not self._watched and self.window.comm_waits is not None and self.comm.calls == 0:
            self.window.comm_waits = None  # nothing timed (an unwatched DDP model?): unknown, not zero
        wanted = self._comm_profile if self._comm_profile is not None else on_device(self.device)
        if wanted and distributed.several_ranks():  # every rank is here, and profiles the same steps
            self._tail = CommTail(self.device)
        elif self._on_close is not None:  # every rank is here: same step count
            self._on_close(self)

    def _tail_done(self) -> None:
        assert self._tail is not None
        self.profiled_comm_share, self._tail = self._tail.share, None
        if self.window.comm_waits is None and self.window.comm_share is None:
            self.window.comm_share = self.profiled_comm_share  # NCCL: no host timing to win over it
        if self._on_close is not None:
            self._on_close(self)

    def _patch(self) -> None:
        if self._collectives and self._patches is None:
            self._patches = self.comm.patch_python_collectives(say="ddp" not in self._watched)

    def _unpatch(self) -> None:
        if self._patches is not None:
            self._patches.close()
            self._patches = None
