"""The finish's budget: seconds in all, planned run by run, and rounds per question
(:mod:`tuner.tuning.finish`)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

CAP_ROUNDS = 100
"""Interleaved rounds one question may take (``--confirm``): the budget usually comes first."""


@dataclass
class Budget:
    """How much the finish may measure: seconds in all, rounds per question."""

    seconds: float | None
    """``None``: no time limit (only the rounds)."""
    rounds: int = CAP_ROUNDS
    typical_s: float | None = None
    """What one run is expected to take before the finish has timed one (the search's median trial)."""
    clock: Callable[[], float] = time.monotonic
    started: float | None = None
    durations: dict[str, list[float]] = field(default_factory=dict)
    """Seconds of each run the finish took, by configuration."""
    held: Callable[[], float] | None = None
    """Seconds the rounds leave for the attribution's runs after them, asked before each run
    (:func:`tuner.tuning.path.hold_for`), so the rounds never spend the time that measures
    the one-at-a-time line."""

    def held_s(self) -> float:
        """What :attr:`held` holds back now."""
        return self.held() if self.held is not None else 0.0

    def expected(self, k: str) -> float:
        """What a run of configuration ``k`` is expected to take: its own runs' median, else
        every finish run's, else :attr:`typical_s`."""
        own = self.durations.get(k)
        if own:
            return statistics.median(own)
        every = [d for ds in self.durations.values() for d in ds]
        return statistics.median(every) if every else (self.typical_s or 0.0)

    def fits(self, k: str) -> bool:
        """Whether one more run of ``k`` ends inside the seconds (rank 0's clock: callers agree)."""
        if self.seconds is None:
            return True
        if self.started is None:
            self.started = self.clock()
        return self.clock() - self.started + self.expected(k) <= self.seconds - self.held_s()

    def rounds_left(self, per_round_s: float) -> int:
        """Whole rounds of ``per_round_s`` seconds that still fit (the rounds cap without a time limit)."""
        if self.seconds is None or per_round_s <= 0:
            return self.rounds
        if self.started is None:
            self.started = self.clock()
        return max(0, int((self.seconds - self.held_s() - (self.clock() - self.started)) / per_round_s))


HELD_AT_MOST = 0.5
"""The share of the finish's seconds the attribution's runs may hold back from its rounds."""


def hold(budget: Budget, runs: int) -> float:
    """Seconds to hold back from the rounds for ``runs`` attribution runs after them (each
    expected to take what a run takes: :meth:`Budget.expected`), at most
    :data:`HELD_AT_MOST` of the budget. The rounds decide; the attribution describes, so it
    gets what it needs to say each change's gain once, not more, and only what the rounds
    have not measured by then (their leave-one-outs are most of the path)."""
    if budget.seconds is None or runs <= 0:
        return 0.0
    return min(runs * budget.expected(""), HELD_AT_MOST * budget.seconds)
