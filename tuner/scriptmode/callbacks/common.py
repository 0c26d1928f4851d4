"""What the trainer callbacks share: their settings, the probe, and how training ends."""

from __future__ import annotations

import sys
from typing import Any

from tuner.harness.distributed import is_main_process
from tuner.harness.system.flops import AttentionCalls
from tuner.scriptmode.probe import Probe


class ProbeCallbackBase:
    """Settings and the end of training for a trainer callback around a :class:`tuner.Probe`.

    Args:
        warmup, measure: as for :class:`tuner.Probe` (``measure=None``: every step after
            the warm-up).
        stop_when_done: end training once the measured window is complete.
        report: print a one-line summary on rank 0 when training ends.
        **probe_kwargs: passed to :class:`tuner.Probe` (``flops_per_sample``, ``nvtx``, ...).
    """

    trainer_name = "trainer"

    def __init__(self, warmup: int = 5, measure: int | str | None = None, *, stop_when_done: bool = False,
                 report: bool = True, **probe_kwargs: Any) -> None:
        self.warmup, self.measure = warmup, measure
        self.stop_when_done, self.report = stop_when_done, report
        self.probe_kwargs = probe_kwargs
        self.probe: Probe | None = None
        self.summary: dict[str, Any] | None = None
        self._attention: AttentionCalls | None = None

    def _watch_attention(self) -> None:
        """Watch the first step for calls of scaled_dot_product_attention (for advice only
        some models can take: an attention kernel)."""
        self._attention = AttentionCalls()
        self._attention.start()

    def _attention_seen(self) -> None:
        """End the watch (at the first step's end, or training's) and record what it saw."""
        if self._attention is None:
            return
        seen, self._attention = self._attention.stop(), None
        model = self.probe.ran.get("model") if self.probe is not None else None
        if seen is not None and isinstance(model, dict):
            model["attention"] = seen

    def _start(self, device: Any, amp_dtype: str | None) -> Probe:
        if amp_dtype is not None:
            self.probe_kwargs.setdefault("amp_dtype", amp_dtype)
        self.probe = Probe(self.warmup, self.measure, device=device, **self.probe_kwargs)
        return self.probe

    def _finish(self) -> None:
        """Summarise (a collective under several ranks: every rank's callback gets here)."""
        self._attention_seen()
        if self.probe is None or not self.probe.window.step_times:
            if is_main_process():
                print(f"tuner probe: training ended before a step was measured (warm-up is {self.warmup} steps); "
                      "train longer or lower the warm-up", file=sys.stderr)
            return
        self.summary = self.probe.summary()
        self.probe.close()
        if self.report:
            print_summary(self.summary, self.trainer_name)


def print_summary(summary: dict[str, Any], where: str) -> None:
    """``tuner probe (<where>): N samples/s, step p50/p99 ..., data wait x%, comm y%`` (rank 0)."""
    if not is_main_process():
        return
    parts = [f"{summary['samples_per_s']:.1f} samples/s",
             f"step p50 {1000 * summary['step_time_p50_s']:.1f} ms / p99 {1000 * summary['step_time_p99_s']:.1f} ms",
             "data wait not measured" if summary.get("data_wait_share") is None  # never a made-up 0, nor a crash
             else f"data wait {100 * summary['data_wait_share']:.0f}%"]
    if summary.get("comm_share") is not None:
        parts.append(f"comm {100 * summary['comm_share']:.0f}%")
    if summary.get("mfu") is not None:
        parts.append(f"MFU {100 * summary['mfu']:.1f}%")
    print(f"tuner probe ({where}): " + ", ".join(parts), file=sys.stderr)
