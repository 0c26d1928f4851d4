"""How long to measure, and which of the measured steps count: until the number is
trustworthy, not after a fixed count, and never on a first-use cost.

``steps.measure: auto`` measures until the 95% confidence interval of the mean step time is
within :attr:`Auto.half_width` of it, between :attr:`Auto.min_steps` / :attr:`Auto.min_s`
and :attr:`Auto.max_steps` / :attr:`Auto.max_s`. Consecutive step times are correlated
(workers deliver in bursts), so the interval counts them as fewer independent steps, by
their lag-1 autocorrelation. First-use costs past the recipe's warm-up (a worker's first
batches, first kernels, a growing allocator) are set aside, not averaged in (:func:`warm_up`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from tuner.stats.student_t import t_quantile

AUTO_MAX_STEPS = 2000
"""The longest an ``auto`` measured window runs, in steps."""


def warm_up(step_times: Sequence[float], most: int | None = None) -> int:
    """How many leading steps of a window are still warming up: the longest prefix, of at
    most ``most`` steps (default: half the window), every step of which is slower than every
    step after it.

    A plateau of any length up to half the window is found (3 equal slow steps, then the
    steady ones), not only a run that keeps getting faster. With steady noise alone the
    first step is the slowest of all about once in ``n`` windows and is then set aside
    (two steps once in ``n (n - 1) / 2``), in every configuration alike. A spike later in the
    window (a collection, a checkpoint) slower than the plateau hides it: the window then
    reads it as the job's own cost."""
    n = len(step_times)
    limit = n // 2 if most is None else min(most, n - 1)
    if n < 2 or limit < 1:
        return 0
    slowest_after = [-math.inf] * n  # the largest of step_times[i:]
    running = -math.inf
    for i in range(n - 1, -1, -1):
        running = max(running, step_times[i])
        slowest_after[i] = running
    found, low = 0, math.inf
    for k in range(1, limit + 1):
        low = min(low, step_times[k - 1])
        if low > slowest_after[k]:
            found = k
    return found


def settled(step_times: Sequence[float]) -> Sequence[float]:
    """The window's steps past its warm-up (:func:`warm_up`): what every figure is taken from."""
    return step_times[warm_up(step_times):]


def rate_uncertainty(step_times: Sequence[float]) -> float | None:
    """Relative half-width of the 95% confidence interval of the mean step time (hence of
    samples/s); ``None`` below 3 steps. Neighbouring steps are correlated (a slow step
    after a fast one, a burst of ready batches), so the sample counts as ``n (1 - r) /
    (1 + r)`` independent steps, ``r`` its lag-1 autocorrelation (0 when negative: then
    the plain estimate is the cautious one)."""
    n = len(step_times)
    if n < 3:
        return None
    mean = statistics.fmean(step_times)
    if mean <= 0:
        return None
    sd = statistics.stdev(step_times)
    if sd == 0:
        return 0.0
    deviations = [t - mean for t in step_times]
    lag1 = sum(a * b for a, b in zip(deviations, deviations[1:])) / sum(d * d for d in deviations)
    r = min(max(lag1, 0.0), 0.9)
    effective = max(2.0, n * (1 - r) / (1 + r))
    return t_quantile(int(effective) - 1, 0.95) * sd / math.sqrt(effective) / mean


@dataclass(frozen=True)
class Auto:
    """The ``auto`` measured window's stopping rule."""

    half_width: float = 0.08
    """Relative half-width of the 95% interval of the mean step time to reach. Tighter buys
    little: whole trials of one configuration differ by more than the window adds, and the
    finish repeats what must be compared closely (docs/benchmarks.md: ``scripts/bench_windows.py``).
    """
    min_steps: int = 8
    min_s: float = 1.0
    """Measured seconds at least: timer and scheduler noise need some length to average out."""
    max_steps: int = AUTO_MAX_STEPS
    max_s: float = 15.0

    def enough(self, step_times: Sequence[float]) -> bool:
        """Whether the window may end: its caps reached, or its settled steps (past a
        first-use plateau, :func:`warm_up`) pin the rate down to :attr:`half_width`."""
        if len(step_times) >= self.max_steps or sum(step_times) >= self.max_s:
            return True
        step_times = settled(step_times)
        n, total = len(step_times), sum(step_times)
        if n >= self.max_steps or total >= self.max_s:
            return True
        if n < self.min_steps or total < self.min_s:
            return False
        spread = rate_uncertainty(step_times)
        return spread is not None and spread <= self.half_width

    def next_check(self, steps: int) -> int:
        """When to ask again after ``steps``: a fifth more steps (never past the cap), so a
        multi-rank window agrees a handful of times per window, not at every step."""
        return min(steps + max(1, steps // 5), max(self.max_steps, steps + 1))


AUTO = Auto()
"""The rule ``steps.measure: auto`` uses."""
