"""The data-wait arithmetic on the device's timeline, from recorded timestamps.

A GPU runs what the host queued, in order, on its stream; a CUDA event recorded on the
stream completes when the stream reaches it. :class:`Stream` replays such a timeline from
timestamps set by the test (the host's clock, what each queued kernel costs), and hands the
probe marks through the same :class:`~tuner.harness.timing.Timing` interface as
:class:`~tuner.harness.timing.CudaEvents`: what the probe makes of them (which wait belongs to
which step, the copy's part of it, what may be read while the window is open) is what it
makes of CUDA events. The truths are the stream's own idle gaps, computed here from the
timestamps."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tuner.harness.metrics import summarize
from tuner.harness.probe_core import ProbeCore
from tuner.harness.timing import Fetch, HostClock, step_waits


@dataclass(frozen=True)
class Mark:
    host: float
    device: float


class Stream:
    """One stream's timeline: ``now`` is the host's clock, ``busy_until`` when the stream
    finishes what was queued so far."""

    deferred = True

    def __init__(self) -> None:
        self.now = 0.0
        self.busy_until = 0.0

    def run(self, host_s: float) -> None:
        """The host spends ``host_s`` (in ``next()``, or queuing)."""
        self.now += host_s

    def queue(self, kernel_s: float) -> None:
        """A kernel of ``kernel_s`` on the stream; the stream starts it when the host queues it
        or when the previous one ends, whichever is later."""
        self.busy_until = max(self.busy_until, self.now) + kernel_s

    def mark(self) -> Mark:
        self.busy_until = max(self.busy_until, self.now)  # an event is a kernel of no length
        return Mark(self.now, self.busy_until)

    def seconds(self, a: Mark, b: Mark) -> float:
        assert self.reached(a) and self.reached(b), "an event read before the device reached it"
        return b.device - a.device

    def host(self, mark: Mark) -> float:
        return mark.host

    def reached(self, mark: Mark) -> bool:
        return mark.device <= self.now

    def wait(self, mark: Mark) -> None:
        self.now = max(self.now, mark.device)


def _train(stream: Stream, probe: ProbeCore, fetch_s: list[float], compute_s: float, copy_s: float | None,
           accum: int = 1) -> None:
    """Steps whose micro-batches take ``fetch_s[i]`` of host time in ``next()``, a copy of
    ``copy_s`` on the stream (None: no copy), then ``compute_s`` of queued kernels."""

    def batches():
        i = 0
        while True:
            stream.run(fetch_s[i % len(fetch_s)])
            i += 1
            yield torch.zeros(4)

    def transfer(batch):
        stream.queue(copy_s)
        return batch

    it = probe.loader(batches(), transfer=transfer if copy_s is not None else None)
    while not probe.done:
        for _ in range(accum):
            next(it)
            stream.queue(compute_s)
            stream.run(0.001)  # queuing costs the host a little
        probe.step()


def test_a_host_running_ahead_of_the_device_waits_for_data_without_the_device_seeing_it():
    """Fetching takes the host 30 ms, the step's kernels 100 ms: the host is ahead, the
    stream never idles, and the exposed wait is 0, while the host clock would have counted
    30 ms of every 100 ms step (a false input-bound verdict)."""
    stream = Stream()
    probe = ProbeCore(warmup=2, measure=6, monitors=False, timing=stream)
    _train(stream, probe, [0.030], compute_s=0.100, copy_s=None)
    window = probe.finish()
    assert window.step_times == pytest.approx([0.100] * 6)
    assert window.data_waits == pytest.approx([0.0] * 6)
    assert probe.total_wait == pytest.approx(0.030 * 8)  # what the host clock saw: the live view only


def test_a_slow_loader_exposes_exactly_the_gap_the_device_idled():
    """Fetching takes 250 or 150 ms and the kernels 100 ms: the stream finishes a step's
    kernels 100 ms after they are queued, the host asks for the next batch 1 ms after
    queuing them, so the stream idles fetch - 99 ms before each batch."""
    stream = Stream()
    probe = ProbeCore(warmup=1, measure=5, monitors=False, timing=stream)
    _train(stream, probe, [0.150, 0.250], compute_s=0.100, copy_s=None)
    window = probe.finish()
    assert window.data_waits == pytest.approx([0.151, 0.051, 0.151, 0.051, 0.151])
    for step, wait in zip(window.step_times, window.data_waits):
        assert wait == pytest.approx(step - 0.100)  # everything but the kernels was waiting
    share = summarize([window])["data_wait_share"]
    assert share == pytest.approx(sum(window.data_waits) / sum(window.step_times))


def test_the_copy_is_its_own_part_of_the_wait_under_gradient_accumulation():
    """Three micro-batches a step, each copied (20 ms on the stream) after a fetch the host
    finishes 50 ms after the kernels: per step, wait = 3 x (idle gap + copy), copy = 3 x 20 ms."""
    stream = Stream()
    probe = ProbeCore(warmup=1, measure=4, monitors=False, timing=stream)
    _train(stream, probe, [0.080], compute_s=0.030, copy_s=0.020, accum=3)
    window = probe.finish()
    assert window.transfer_waits == pytest.approx([0.060] * 4)
    for step, wait in zip(window.step_times, window.data_waits):
        assert wait == pytest.approx(step - 3 * 0.030)
    assert all(w > 0.060 for w in window.data_waits)


def test_inside_the_window_only_steps_the_device_finished_are_read():
    """A device 5 steps behind: while the window is open the probe holds only the steps whose
    end the stream has reached (what a prune or an auto window may decide from); after the
    window every step is read, and no mark was read before the stream reached it."""
    stream = Stream()
    probe = ProbeCore(warmup=0, measure=8, monitors=False, timing=stream)
    it = probe.loader(torch.zeros(100, 1).split(1))
    settled = []
    for _ in range(8):
        next(it)
        stream.queue(0.5)  # the host queues 0.5 s of kernels in 1 ms: it runs far ahead
        stream.run(0.001)
        probe.step()
        settled.append(len(probe.window.step_times))
    assert probe.measured == 8 and settled[-1] == 0  # the device has not finished a step yet
    stream.run(1.2)  # the device has now finished two steps
    probe._settle(block=False)
    assert len(probe.window.step_times) == 2
    window = probe.finish()
    assert window.step_times == pytest.approx([0.5] * 8) and window.samples == [1] * 8


def test_on_the_host_clock_the_wait_is_the_time_blocked():
    """The CPU source: the same arithmetic on host timestamps is plain time blocked."""
    clock = HostClock()
    fetches = [Fetch(1.0, 1.25), Fetch(2.0, 2.5, 2.75)]
    assert step_waits(clock, fetches) == pytest.approx((1.0, 0.25))
