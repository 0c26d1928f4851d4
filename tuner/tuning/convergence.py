"""When the search has converged: the sampler's trials, past the guided neighbourhood of the
best, read by the one rule (:mod:`tuner.stats.decision`) against the best before each.

A trial counts toward convergence when the rule shows it no gain beyond the tolerance over
the best (or it did not run fine); one shown a gain starts the count again; one the
interval cannot place yet changes nothing. The interval needs the run's noise, so once the
guided neighbourhood is measured the best is measured again until the run has
:data:`NOISE_DOF` degrees of freedom (runs the finish reuses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.stats import decision
from tuner.trial.trial_result import State
from tuner.tuning import budget

if TYPE_CHECKING:
    from tuner.study.trial_record import Record
    from tuner.tuning.pool import Pool

NOISE_DOF = 4
"""Degrees of freedom of the run's noise the stop needs before it can read any sampler trial."""


class Convergence:
    """The count of sampler trials shown no gain over the best, and the repeats of the best
    that let the interval show it."""

    def __init__(self, pool: "Pool", tolerance: float) -> None:
        self.pool, self.tolerance = pool, tolerance
        self.streak = 0
        """Sampler trials, since the guided neighbourhood ran out, shown no gain beyond the
        tolerance over the best (reset by one shown a gain)."""
        self.repeats = 0
        """Runs of the best measured again to learn the noise."""
        self.sampled = False
        """The trial in flight came from the sampler with the guided neighbourhood exhausted."""

    def repeat(self, best: "Record") -> dict[str, Any] | None:
        """The best's knobs to measure again while the run's noise is unknown (``None``: known,
        or the repeats failed too often to learn it)."""
        if self.pool.spread()[1] >= NOISE_DOF or self.repeats >= NOISE_DOF + 2:
            return None
        self.repeats += 1
        return best.params

    def converged(self, space_size: int, measured: int) -> bool:
        return self.streak >= budget.converged_after(space_size, measured)

    def record(self, before: "Record | None", trial: "Record") -> None:
        """Count ``trial`` (just recorded) against ``before``, the best before it."""
        if before is None:
            self.streak = 0
            return
        if not self.sampled:
            return
        if trial.outcome != State.OK:
            self.streak += 1
            return
        verdict = decision.judge(self.pool.slowdown(trial.params, before.params),
                                 self.tolerance)
        if verdict == decision.KEEP:
            self.streak = 0
        elif verdict == decision.DROP:
            self.streak += 1
