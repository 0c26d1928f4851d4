"""The prune rule: cut a trial whose steady steps show it slower than the best so far by
more than the tolerance, by the interval the search decides with.

One rule for both places a trial runs: the tuner's own loop and a script's ``tuner.Probe``
(the rule travels in the trial file as four numbers, so the script applies the very rule
the search would). It is asked early and then more and more sparsely (:func:`checks`) on
the steps the device has finished.

Never on a point estimate, never on warm-up: the steps still getting faster are the trial's
warm-up, whatever the recipe's ``steps.warmup`` said (:func:`steady`). Before this rule a
trial below a third of the best after two measured steps was cut: on timm's own train.py,
bf16's first steps cost 1.6-1.9 s against 0.25 s later (first-use costs past the 2
warm-up steps), both bf16 trials were cut and the 1.2-1.3x it measured in every other
search was given back. The interval counts the window's own spread and one run's noise
twice (this run's and the best's, each a single run): the run's measured noise when it is
known, :data:`ASSUMED_NOISE` before.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from tuner.harness.metrics import Window
from tuner.harness.student_t import t_quantile

MIN_STEADY = 3
"""Steady steps (past the detected warm-up) the rule needs before it can cut."""
ASSUMED_NOISE = 0.10
"""One run's relative noise assumed before the search has measured any configuration
twice (whole windows here differ 5-10%): a wide interval, so an early cut needs a trial
far behind, about 40% at a 2% tolerance."""


def steady(step_times: list[float]) -> int:
    """How many leading steps are still warm-up: each slower than every step after it (a
    trial still getting faster). With steady noise alone a step is slower than all later
    ones rarely (1 in the steps left), and then only that step is set aside."""
    k, n = 0, len(step_times)
    if n < 2:
        return 0
    later_max = [0.0] * n
    running = -math.inf
    for i in range(n - 1, -1, -1):
        later_max[i] = running
        running = max(running, step_times[i])
    while k < n - 1 and step_times[k] > later_max[k]:
        k += 1
    return k


@dataclass(frozen=True)
class PruneBar:
    """Cut when the steady steps' rate is shown below ``best x (1 - tolerance)``."""

    best: float
    """The best rate so far (samples/s, all ranks)."""
    world_size: int
    tolerance: float = 0.02
    noise: float | None = None
    """One run's relative noise measured in this search (``None``: not yet known)."""

    def __call__(self, window: Window) -> bool:
        start = steady(window.step_times)
        times, samples = window.step_times[start:], window.samples[start:]
        if len(times) < MIN_STEADY:
            return False
        logs = [math.log(s * self.world_size / t) for s, t in zip(samples, times) if t > 0 and s > 0]
        if len(logs) < MIN_STEADY:
            return False
        run = self.noise if self.noise is not None else ASSUMED_NOISE
        var = statistics.variance(logs) / len(logs) + 2 * run**2
        upper = statistics.fmean(logs) + t_quantile(len(logs) - 1) * math.sqrt(var)
        return upper < math.log(self.best * (1 - self.tolerance))

    def to_json(self) -> dict[str, Any]:
        return {"best": self.best, "world_size": self.world_size, "tolerance": self.tolerance, "noise": self.noise}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PruneBar":
        noise = data.get("noise")
        return cls(float(data["best"]), int(data["world_size"]), float(data.get("tolerance", 0.02)),
                   float(noise) if noise is not None else None)


def checks(most: int) -> frozenset[int]:
    """Measured step counts at which the rule is asked: early and then more and more
    sparsely (2, 3, 4, 6, 9, 13, ...), up to half the window. Asked once, after a quarter
    of the window, pruned trials cost more than finished ones on the issue's job (7-8 s
    against 3-5 s): they ran their slow steps until then."""
    out, n = set(), 2
    while n <= max(2, most // 2):
        out.add(n)
        n = max(n + 1, n * 3 // 2)
    return frozenset(out)
