"""The one rule for every keep, drop, stop, pass and fail.

A decision is between a *richer* configuration ``a`` (with the change) and a *simpler* one
``b`` (without it), read from the interval of how much slower ``b`` is
(:func:`tuner.stats.interval.slowdown`):

- ``drop``: the interval shows ``b`` within the tolerance (its upper bound below it).
- ``keep``: the interval shows ``b`` slower by more than the tolerance.
- ``undecided``: neither. More is measured until the interval decides, or is precise (half
  its width below half the tolerance), or a cap is reached; then the richer configuration
  stays, labelled ``undecided`` with its interval: a measured change leaves only on evidence.

The interval is looked at on a schedule (:data:`LOOKS`, each 1.5 times the last), at 99%
each time. The error rates of the procedure as it ships are in docs/search.md
(``scripts/operating_characteristics.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tuner.stats.interval import Slowdown, pairs_needed, t_quantile

KEEP, DROP, UNDECIDED = "keep", "drop", "undecided"
GROWTH = 1.5
"""Each look comes when the runs have grown by this factor (at least one more run)."""


def _looks(most: int = 100_000) -> tuple[int, ...]:
    out, n = [1], 1
    while n < most:
        n = max(n + 1, math.ceil(n * GROWTH))
        out.append(n)
    return tuple(out)


LOOKS = _looks()
"""Run counts at which a decision is looked at: 1, 2, 3, 5, 8, 12, 18, 27, 41, 62, 93, ...
Looking after every run instead (a 95% interval) gave a real 5% gain away 9.3% of the
time at 22% noise; looking this sparsely at 99%, 1.3%."""


def next_look(runs: int) -> int:
    """The first run count of :data:`LOOKS` above ``runs``."""
    return next(n for n in LOOKS if n > runs)


def judge(s: Slowdown | None, tolerance: float) -> str:
    """:data:`DROP`, :data:`KEEP` or :data:`UNDECIDED` for ``s``, how much slower the
    simpler configuration is than the richer one (``None``: no interval yet)."""
    if s is None:
        return UNDECIDED
    if s.high < tolerance:
        return DROP
    if s.low > tolerance:
        return KEEP
    return UNDECIDED


def precise(s: Slowdown | None, tolerance: float) -> bool:
    """The interval's half-width is below half the tolerance: more runs would not change
    what is at stake by as much as the tolerance."""
    return s is not None and s.half_log < tolerance / 2


def settled(s: Slowdown | None, tolerance: float) -> bool:
    """Nothing more to measure: decided, or precise."""
    return judge(s, tolerance) != UNDECIDED or precise(s, tolerance)


PROJECT_AFTER = 3
"""Pairs a paired interval needs before :func:`pairs_to_settle` projects from its noise."""
OPTIMISM = 0.7
""":func:`pairs_to_settle` projects at this share of the noise the pairs show: a few pairs'
spread is itself uncertain, and projecting at the spread as seen gives up on gains that
more pairs would settle (``scripts/operating_characteristics.py`` measures the choice)."""


def pairs_to_settle(s: Slowdown | None, tolerance: float, most: int = 10_000) -> int | None:
    """About how many pairs in all the paired interval ``s`` needs to be :func:`settled`
    (decided, or precise), were the estimate to stay and the noise to be :data:`OPTIMISM`
    of what its pairs show: the half-width goes as ``t(k-1) / sqrt(k)``. ``None`` for an
    unpaired interval or one of fewer than :data:`PROJECT_AFTER` pairs; ``most + 1`` where
    even ``most`` would not do. A change whose true effect sits on the tolerance cannot be
    settled in any budget; this keeps the finish from spending its own on one.
    """
    if s is None or s.pairs < PROJECT_AFTER or not math.isfinite(s.half_log):
        return None
    n = s.pairs
    centre = (-math.log(1 - s.low) - math.log(1 - s.high)) / 2  # log(rate_a / rate_b)
    target = max(abs(centre + math.log(1 - tolerance)), tolerance / 2)  # to decide, or to be precise
    spread = OPTIMISM * s.half_log * math.sqrt(n) / t_quantile(n - 1)
    need = pairs_needed(spread, target, n, most + 1)
    return most + 1 if need is None else need


@dataclass(frozen=True)
class Call:
    """A decision as made: the verdict, whether the interval made it, and the interval."""

    verdict: str
    """:data:`KEEP` (the richer stays) or :data:`DROP` (the simpler replaces it)."""
    decided: bool
    """False: the cap came first; the richer stayed, undecided."""
    slowdown: Slowdown | None
    tolerance: float

    @property
    def label(self) -> str:
        """``kept``, ``dropped`` or ``undecided``."""
        if not self.decided:
            return UNDECIDED
        return "kept" if self.verdict == KEEP else "dropped"

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "label": self.label, "decided": self.decided, "tolerance": self.tolerance,
                "slowdown": self.slowdown.to_json() if self.slowdown is not None else None}


def call(s: Slowdown | None, tolerance: float) -> Call:
    """The decision as it stands now (at the cap, if it is undecided)."""
    verdict = judge(s, tolerance)
    if verdict == UNDECIDED:
        return Call(KEEP, False, s, tolerance)
    return Call(verdict, True, s, tolerance)
