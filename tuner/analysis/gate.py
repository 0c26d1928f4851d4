"""The performance regression gate users put in CI (``python -m tuner.check``): the verdict.

What is gated is a ratio measured inside one run: the recorded answer's speedup over the
recorded baseline, both re-measured interleaved now, against the speedup the search
recorded, by the one rule (:mod:`tuner.stats.decision`) at the gate's tolerance. An
absolute rate from another process is no measure of a regression on a shared machine: the
same configuration measured 2,630 samples/s against 1,635 recorded in another process here
(1.61x), so a gate on absolute rates passed a result inflated 3x and needed a 50%
tolerance to pass an unchanged one. Absolute rates are printed; gating on them is asked
for (``--absolute``).

- ``regression`` (exit 1): the interval shows the speedup now below the recorded one by
  more than the tolerance (or, with ``--absolute``, the answer's rate).
- ``pass``: the interval shows it within the tolerance.
- ``undecided``: neither after the rounds the gate may take; it passes, and says so with
  its interval (only evidence fails a build).

Pure functions of rates; measuring them is :mod:`tuner.tuning.regression`'s.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tuner.stats import decision
from tuner.stats.interval import LogStats, Slowdown, contrast, slowdown

DEFAULT_TOLERANCE = 0.05
DEFAULT_ROUNDS = 10
"""Interleaved rounds (answer and baseline once each, ABBA) the gate may take; it stops as
soon as the rule settles (looked at after 1, 2, 3, 5, 8 rounds)."""


@dataclass
class CheckResult:
    """The recorded speedup, the measured one, and the verdict."""

    recorded: float
    """The recorded answer's samples/s (its median in the search)."""
    measured: float | None
    """The answer's median samples/s now (``None``: it did not run)."""
    recorded_speedup: float | None
    measured_speedup: float | None
    tolerance: float
    passed: bool
    verdict: str
    """``pass``, ``regression``, ``undecided`` (passes) or ``broken`` (a run failed)."""
    reason: str
    params: dict[str, Any] = field(default_factory=dict)
    baseline_params: dict[str, Any] = field(default_factory=dict)
    rates: dict[str, list[float]] = field(default_factory=dict)
    """samples/s of every run now: ``answer`` and ``baseline``."""
    slowdown: dict[str, Any] | None = None
    """The speedup's interval: how much smaller it is now than recorded."""
    absolute: dict[str, Any] | None = None
    """The answer's rate against the recorded one (gated with ``--absolute``)."""
    gated: str = "speedup"
    """``speedup``, or ``speedup+absolute``."""
    rounds: int = 0
    restart: str | None = None
    """Why the process that measured can run nothing more (a run broke it)."""

    @property
    def spread(self) -> list[float]:
        rates = self.rates.get("answer") or []
        return [min(rates), max(rates)] if rates else []

    @property
    def change(self) -> float | None:
        """Measured / recorded speedup - 1 (negative: smaller now)."""
        if self.measured_speedup is None or not self.recorded_speedup:
            return None
        return self.measured_speedup / self.recorded_speedup - 1

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "verdict": self.verdict, "reason": self.reason, "gated": self.gated,
                "tolerance": self.tolerance, "recorded_speedup": self.recorded_speedup,
                "measured_speedup": self.measured_speedup, "change": self.change, "slowdown": self.slowdown,
                "recorded_samples_per_s": self.recorded, "measured_samples_per_s": self.measured,
                "absolute": self.absolute, "spread": self.spread, "rounds": self.rounds, "rates": self.rates,
                "params": self.params, "baseline_params": self.baseline_params}


DECIDING = (("device", "device"), ("world_size", "world size"), ("device_count", "device count"))
"""Environment fields whose difference voids a throughput comparison: (key, what it is)."""


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any], labels: tuple[str, str] = ("recorded", "here"),
                keys: Sequence[tuple[str, str]] = DECIDING) -> list[str]:
    """What differs between two environment records in a way that voids a comparison
    (``labels``: what to call each side; ``keys``: the fields compared)."""
    out = []
    for key, what in keys:
        if key in recorded and recorded.get(key) != current.get(key):
            out.append(f"{what}: {labels[0]} {recorded.get(key)!r}, {labels[1]} {current.get(key)!r}")
    return out


@dataclass(frozen=True)
class Recorded:
    """What the search recorded: every run's samples/s of the answer and of the baseline,
    and the run's pooled noise."""

    answer: Sequence[float]
    baseline: Sequence[float]
    noise: tuple[float, int] = (0.0, 0)


def intervals(recorded: Recorded, answer: Sequence[float], baseline: Sequence[float]
              ) -> tuple[Slowdown | None, Slowdown | None]:
    """(the speedup's, the answer's absolute rate's) interval of how much smaller it is
    now than recorded; the noise of each group counted once, pooled with the recorded
    run's where the groups give too little."""
    now = (LogStats.of(answer), LogStats.of(baseline))
    then = (LogStats.of(recorded.answer), LogStats.of(recorded.baseline))
    wide = (recorded.noise[0] + sum(g.ss for g in now), recorded.noise[1] + sum(max(0, g.n - 1) for g in now))
    return contrast(now, then, wide), slowdown(then[0], now[0], wide)


def settled(recorded: Recorded, answer: Sequence[float], baseline: Sequence[float], tolerance: float,
            absolute: bool) -> bool:
    """Whether more rounds would not change the verdict."""
    speedup, rate = intervals(recorded, answer, baseline)
    return decision.settled(speedup, tolerance) and (not absolute or decision.settled(rate, tolerance))


def verdict(recorded: Recorded, answer: Sequence[float], baseline: Sequence[float], tolerance: float,
            absolute: bool = False, failure: str | None = None, rounds: int = 0) -> CheckResult:
    """The gate's verdict on the runs measured now (``failure``: why a run did not finish)."""
    rec_rate = statistics.median(recorded.answer)
    rec_speedup = rec_rate / statistics.median(recorded.baseline) if recorded.baseline else None
    measured = statistics.median(answer) if answer else None
    speedup_now = measured / statistics.median(baseline) if measured and baseline else None
    out = CheckResult(rec_rate, measured, rec_speedup, speedup_now, tolerance, False, "broken", "",
                      rates={"answer": list(answer), "baseline": list(baseline)},
                      gated="speedup+absolute" if absolute else "speedup", rounds=rounds)
    if failure is not None:
        out.reason = f"the configuration no longer runs: {failure}"
        return out
    speedup, rate = intervals(recorded, answer, baseline)
    out.slowdown = speedup.to_json() if speedup else None
    out.absolute = rate.to_json() if rate else None
    calls = [("the speedup", speedup)] + ([("the answer's samples/s", rate)] if absolute else [])
    judged = [(what, s, decision.judge(s, tolerance)) for what, s in calls]
    worse = [(what, s) for what, s, v in judged if v == decision.KEEP]
    if worse:
        out.verdict = "regression"
        out.reason = "regression: " + "; ".join(f"{what} is {_smaller(s)} than recorded, beyond the "
                                                  f"{tolerance:.0%} tolerance" for what, s in worse)
    elif all(v == decision.DROP for _, _, v in judged):
        out.verdict, out.passed = "pass", True
        out.reason = "within tolerance: " + "; ".join(f"{what} is {_smaller(s)} than recorded, below the "
                                                       f"{tolerance:.0%} tolerance" for what, s, _ in judged)
    else:
        out.verdict, out.passed = "undecided", True
        out.reason = (f"undecided after {rounds} round(s): " + "; ".join(
            f"{what} is {_smaller(s) if s else 'not measured to any interval'} than recorded"
            for what, s, _ in judged) + f"; not shown beyond the {tolerance:.0%} tolerance, so it passes "
            "(more rounds: --rounds)")
    return out


def _smaller(s: Slowdown) -> str:
    """``4.1% smaller (99% interval -1.0% to +9.0%)``."""
    return s.text().replace("slower", "smaller").replace("faster", "larger")
