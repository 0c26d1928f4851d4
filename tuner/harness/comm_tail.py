"""Exposed communication where the host clock cannot see it: a short profiled span right after
the measured window.

Under NCCL the host only enqueues a collective, so a host timer reads nothing of it. The
tuner's own trial (:func:`tuner.trial.ceiling_comm_flops.profiled_comm_share`) and a script's
``tuner.Probe`` (:class:`CommTail`) read it the same way: one profiled step of warm-up (ranks
start profiling at different moments), then :data:`STEPS` steps whose events go to
:func:`tuner.harness.comm.exposed_share`: communication kernels not covered by compute
kernels, over the span the device ran kernels. The profiler runs after the window, so the
window is not perturbed. On gloo the same span reads the host's collectives in flight
(docs/limitations.md; ``scripts/check_comm_share.py`` compares it with the host timer).
"""

from __future__ import annotations

from typing import Any

from tuner.harness.comm import exposed_share, on_device, trace_events

STEPS = 5
"""Profiled steps after the one of warm-up."""


def profiler(device: str) -> Any:
    """A started ``torch.profiler.profile`` over 1 + :data:`STEPS` steps (CUDA kernels too on ``cuda``)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=STEPS, repeat=1))
    prof.__enter__()
    return prof


def share_of(prof: Any, device: str) -> float | None:
    """The exposed communication share of a finished profile's active steps; ``None`` where it
    saw no kernel (CUDA) or no step (CPU)."""
    events = trace_events(prof)
    if device == "cuda":
        kernels = [e for e in events if e["cat"] == "kernel"]
        if not kernels:
            return None
        span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    else:
        span = sum(e["dur"] for e in events if e["name"].startswith("ProfilerStep#"))
        if span <= 0:
            return None
    return exposed_share(events, span, device)


class CommTail:
    """The profiled span a probe runs after its window: :meth:`step` after each optimizer step,
    True once :data:`STEPS` + 1 have run; then :attr:`share` holds the figure (``None`` where
    the profiler could not run: no CUPTI, another profiler active)."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.kind = "cuda" if on_device(device) else "cpu"  # gloo's collectives are the host's
        self.share: float | None = None
        self._steps = 0
        try:
            self._prof: Any = profiler(self.kind)
        except Exception:  # noqa: BLE001 - a profiler already running, no CUPTI: no figure
            self._prof = None

    def step(self) -> bool:
        if self._prof is None:
            return True
        self._steps += 1
        try:
            self._prof.step()
            if self._steps < 1 + STEPS:
                return False
            if self.kind == "cuda":
                import torch

                torch.cuda.synchronize(self.device)
            self._prof.__exit__(None, None, None)
            self.share = share_of(self._prof, self.kind)
        except Exception:  # noqa: BLE001 - the profiler failed mid-span: no figure, the loop goes on
            self.share = None
        self._prof = None
        return True

    def close(self) -> None:
        """Stop a span the loop left before it ended."""
        if self._prof is not None:
            try:
                self._prof.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - closing what failed
                pass
            self._prof = None
