"""The prune rule: cut a trial whose settled steps show it slower than the best so far by
more than the tolerance, on a noise the run has measured.

One rule for the tuner's loop and a script's ``tuner.Probe`` (it travels in the trial file
as data), asked at :func:`checks` on the steps the device has finished. It never cuts on:

- **an assumed noise**: the bar counts the run's pooled noise twice (this trial against the
  best) with its t quantile; with no repeated configuration there is no cut;
- **a first-use plateau**: leading slow steps are warm-up
  (:func:`tuner.stats.window_length.warm_up`), and no cut comes before :data:`MIN_STEADY`
  steps after one could have ended;
- **the window's own luck**: the settled steps' spread bounds the rest of the window, at
  99.5% one-sided beside the noise bound's 99.5%.

Its false cuts are measured in ``tests/stats/test_prune_characteristics.py`` (docs/search.md).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from tuner.stats.student_t import one_sided
from tuner.stats.window_length import warm_up

MIN_STEADY = 3
"""Settled steps (past the detected warm-up) the rule needs before it can cut."""
CONFIDENCE = 0.995
"""One-sided confidence of each of the rule's two bounds (the window's, the runs')."""


class Steps(Protocol):
    """What the rule reads of a window (:class:`tuner.harness.metrics.Window`)."""

    step_times: list[float]
    samples: list[int]


@dataclass(frozen=True)
class PruneBar:
    """Cut when the settled steps' rate is shown below ``best x (1 - tolerance)``."""

    best: float
    """The best rate so far (samples/s, all ranks)."""
    world_size: int
    tolerance: float = 0.02
    noise: float | None = None
    """One run's relative noise measured in this search (``None``: not yet: no cut)."""
    noise_dof: int = 0
    """Degrees of freedom of :attr:`noise` (the t quantile's)."""
    best_runs: int = 1
    """Runs behind :attr:`best` (its median's noise is one run's over the root of these)."""
    settle_within: int = 8
    """The window's expected length in steps: a first-use plateau shorter than half of it is
    set aside, so no cut comes before such a plateau could have ended."""

    def earliest(self) -> int:
        """The first measured step count at which a cut is possible."""
        return self.settle_within // 2 + MIN_STEADY

    def __call__(self, window: Steps) -> bool:
        if self.noise is None or self.noise_dof < 1 or len(window.step_times) < self.earliest():
            return False
        start = warm_up(window.step_times, most=max(len(window.step_times) // 2, self.settle_within // 2))
        times, samples = window.step_times[start:], window.samples[start:]
        logs = [math.log(s * self.world_size / t) for s, t in zip(samples, times) if t > 0 and s > 0]
        if len(logs) < MIN_STEADY:
            return False
        own = one_sided(len(logs) - 1, CONFIDENCE) * statistics.stdev(logs) / math.sqrt(len(logs))
        runs = one_sided(self.noise_dof, CONFIDENCE) * self.noise * math.sqrt(1 + 1 / max(1, self.best_runs))
        return statistics.fmean(logs) + own + runs < math.log(self.best * (1 - self.tolerance))

    def to_json(self) -> dict[str, Any]:
        return {"best": self.best, "world_size": self.world_size, "tolerance": self.tolerance, "noise": self.noise,
                "noise_dof": self.noise_dof, "best_runs": self.best_runs, "settle_within": self.settle_within}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PruneBar":
        noise = data.get("noise")
        return cls(float(data["best"]), int(data["world_size"]), float(data.get("tolerance", 0.02)),
                   float(noise) if noise is not None else None, int(data.get("noise_dof", 0)),
                   int(data.get("best_runs", 1)), int(data.get("settle_within", 8)))


def checks(most: int) -> frozenset[int]:
    """Measured step counts at which the rule is asked: more and more sparsely (2, 3, 4, 6,
    9, 13, ...), up to the step before the window's last, so a slow trial stops early. Every
    rank asks at the same counts (rank 0 decides, all follow), whatever the bar:
    :meth:`PruneBar.earliest` is the bar's own floor.
    """
    out, n = set(), 2
    while n < max(3, most):
        out.add(n)
        n = max(n + 1, n * 3 // 2)
    return frozenset(out)


def typical_window(measured_steps: Sequence[int], fixed: int | None, floor: int) -> int:
    """The window length a plateau is judged against: the recipe's fixed count, else the
    median settled length of this run's windows, else ``floor`` (the auto window's minimum)."""
    if fixed is not None:
        return fixed
    return max(floor, int(statistics.median(measured_steps))) if measured_steps else floor
