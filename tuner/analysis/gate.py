"""The performance regression gate users put in CI (``python -m tuner.check``): the verdict.

What is gated is a ratio measured in one run: the recorded answer's speedup over the
recorded baseline, both re-measured interleaved now, against the recorded speedup, by the
one rule (:mod:`tuner.stats.decision`). A rate from another process is no measure on a
shared machine; absolute rates are gated only when asked (``--absolute``).
``regression`` (exit 1), ``pass``, or ``undecided`` (exit 4, never a pass).

``--rev`` (:func:`rev_verdict`) gates the code: the recipe at a git revision against the
working tree, each side in fresh processes, interleaved, read as pairs (it sees a slowdown
every configuration shares, which the ratio cannot). Measuring is
:mod:`tuner.tuning.gate_rounds`'s.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tuner.stats import decision
from tuner.stats.interval import LogStats, Slowdown, contrast, paired, pairs_needed, slowdown, t_quantile

DEFAULT_TOLERANCE = 0.05
DEFAULT_ROUNDS = 20
"""``--against``'s most rounds, as ``--rev``'s (10 left a busy machine's clear regressions undecided)."""
DEFAULT_REV_ROUNDS = 20
"""``--rev``'s most rounds (each side once, a fresh process each): enough to settle a 10%
slowdown against the 5% tolerance at a few percent of noise between processes
(docs/analysis.md has the power table)."""
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
    """``pass``, ``regression``, ``undecided`` (exit 4) or ``broken`` (a run failed)."""
    why: dict[str, Any] = field(default_factory=dict)
    """The verdict's grounds (:func:`tuner.outputs.wording.gate` says them): ``failure`` where
    it is broken (the ``side``, its ``state`` and the run's ``reason``), else ``judged``, each
    ``what`` (``speedup`` or ``absolute``) with its ``slowdown`` (how much smaller now than
    recorded; ``None``: no interval yet)."""
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
    def exit_code(self) -> int:
        return exit_status(self.verdict)

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
        return {"passed": self.passed, "verdict": self.verdict, "why": self.why, "gated": self.gated,
                "tolerance": self.tolerance, "recorded_speedup": self.recorded_speedup,
                "measured_speedup": self.measured_speedup, "change": self.change, "slowdown": self.slowdown,
                "recorded_samples_per_s": self.recorded, "measured_samples_per_s": self.measured,
                "absolute": self.absolute, "spread": self.spread, "rounds": self.rounds, "rates": self.rates,
                "params": self.params, "baseline_params": self.baseline_params}


DECIDING = ("device", "world_size", "device_count")
"""Environment fields whose difference voids a throughput comparison."""


@dataclass(frozen=True)
class Difference:
    """An environment field two records hold differently (``None``: unset on that side)."""

    key: str
    a: Any
    b: Any


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any],
                keys: Sequence[str] = DECIDING) -> list[Difference]:
    """The fields of ``keys`` that ``recorded`` holds and ``current`` holds differently."""
    return [Difference(k, recorded.get(k), current.get(k)) for k in keys
            if k in recorded and recorded.get(k) != current.get(k)]


@dataclass(frozen=True)
class Recorded:
    """What the search recorded: every run's samples/s of the answer and of the baseline,
    and the run's pooled noise."""

    answer: Sequence[float]
    baseline: Sequence[float]
    noise: tuple[float, int] = (0.0, 0)


def intervals(recorded: Recorded, answer: Sequence[float], baseline: Sequence[float],
              process_noise: float | None = None) -> tuple[Slowdown | None, Slowdown | None]:
    """(the speedup's, the answer's absolute rate's) interval of how much smaller it is
    now than recorded; the noise of each group counted once, pooled with the recorded
    run's where the groups give too little. The absolute one only with ``process_noise``
    (one run's relative noise between two processes, given): this run's and the record's
    process each add it once, so another process is never judged with in-process noise."""
    now = (LogStats.of(answer), LogStats.of(baseline))
    then = (LogStats.of(recorded.answer), LogStats.of(recorded.baseline))
    wide = (recorded.noise[0] + sum(g.ss for g in now), recorded.noise[1] + sum(max(0, g.n - 1) for g in now))
    return (contrast(log_ratios(answer, baseline), then, recorded.noise),
            across_processes(then[0], now[0], wide, process_noise))


def across_processes(then: LogStats, now: LogStats, wide: tuple[float, int],
                     process_noise: float | None) -> Slowdown | None:
    """How much slower ``now`` is than ``then``, measured in two processes: the runs' own
    noise plus ``process_noise`` once for each process (``None``: not given: no interval)."""
    base = slowdown(then, now, wide)
    if base is None or process_noise is None:
        return None
    diff = then.mean - now.mean
    within = (base.half_log / t_quantile(base.dof)) ** 2
    half = t_quantile(base.dof) * math.sqrt(within + 2 * process_noise**2)
    low, high = (1 - math.exp(-(diff - half)), 1 - math.exp(-(diff + half)))
    return Slowdown(1 - math.exp(-diff), low, high, base.runs, base.dof)


def settled(recorded: Recorded, answer: Sequence[float], baseline: Sequence[float], tolerance: float,
            absolute: bool, process_noise: float | None = None) -> bool:
    """Whether the rule has decided the gate: pass or fail, as ``--rev``'s rounds stop. A
    precise interval does not stop it, as it stops the finish: a gate must say pass or fail,
    so it goes on while rounds are left."""
    speedup, rate = intervals(recorded, answer, baseline, process_noise)
    judged = [decision.judge(s, tolerance) for s in (speedup, rate)[:2 if absolute else 1]]
    return decision.KEEP in judged or decision.UNDECIDED not in judged  # a regression, or all decided


def verdict(recorded: Recorded, answer: Sequence[float], baseline: Sequence[float], tolerance: float,
            absolute: bool = False, failure: dict[str, Any] | None = None, rounds: int = 0,
            process_noise: float | None = None) -> CheckResult:
    """The gate's verdict on the runs measured now (``failure``: why a run did not finish)."""
    rec_rate = statistics.median(recorded.answer)
    rec_speedup = rec_rate / statistics.median(recorded.baseline) if recorded.baseline else None
    measured = statistics.median(answer) if answer else None
    speedup_now = measured / statistics.median(baseline) if measured and baseline else None
    out = CheckResult(rec_rate, measured, rec_speedup, speedup_now, tolerance, False, "broken",
                      rates={"answer": list(answer), "baseline": list(baseline)},
                      gated="speedup+absolute" if absolute else "speedup", rounds=rounds)
    if failure is not None:
        out.why = {"failure": failure}
        return out
    speedup, rate = intervals(recorded, answer, baseline, process_noise)
    out.slowdown = speedup.to_json() if speedup else None
    out.absolute = rate.to_json() if rate else None
    calls = [("speedup", speedup)] + ([("absolute", rate)] if absolute else [])
    judged = [(what, s, decision.judge(s, tolerance)) for what, s in calls]
    worse = [(what, s) for what, s, v in judged if v == decision.KEEP]
    if worse:
        out.verdict = "regression"
    elif all(v == decision.DROP for _, _, v in judged):
        out.verdict, out.passed = "pass", True
    else:
        out.verdict, out.passed = "undecided", False
    out.why = {"judged": [{"what": what, "slowdown": s.to_json() if s else None}
                          for what, s in (worse or [(what, s) for what, s, _ in judged])]}
    return out


EXIT = {"pass": 0, "regression": 1, "broken": 1, "undecided": 4}
"""The command's exit status for each verdict: undecided is its own (4), never a pass."""
UNDECIDED = {"exit": EXIT["undecided"], "pass": EXIT["pass"], "fail": EXIT["regression"]}
"""What ``tuner check --undecided`` makes of an undecided gate, for a CI that takes two
outcomes: its own status (the default), a pass, or a failure."""


def exit_status(verdict: str, undecided: str = "exit") -> int:
    """The command's exit status for ``verdict``, an undecided one as ``undecided`` says."""
    return UNDECIDED[undecided] if verdict == "undecided" else EXIT[verdict]


@dataclass
class RevResult:
    """``tuner check --rev``: the working tree against a git revision, measured as pairs."""

    rev: str
    """The revision as given, and its commit."""
    commit: str
    tolerance: float
    verdict: str
    """``pass``, ``regression``, ``undecided`` or ``broken`` (a side did not run)."""
    failure: dict[str, Any] | None = None
    """Which side did not run and why (``broken``): ``{"side": "work", "reason": ...}``."""
    rates: dict[str, list[float]] = field(default_factory=dict)
    """samples/s of every run: ``rev`` and ``work`` (the working tree), one of each a round."""
    slowdown: dict[str, Any] | None = None
    """How much slower the working tree is than the revision: the paired interval's JSON."""
    rounds: int = 0
    more_rounds: int | None = None
    """Undecided: about how many more rounds would decide it at the noise measured."""

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def exit_code(self) -> int:
        return exit_status(self.verdict)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "verdict": self.verdict, "exit_code": self.exit_code, "failure": self.failure,
                "rev": self.rev, "commit": self.commit, "tolerance": self.tolerance, "rounds": self.rounds,
                "slowdown": self.slowdown, "more_rounds": self.more_rounds, "rates": self.rates}


def log_ratios(rev: Sequence[float], work: Sequence[float]) -> list[float]:
    """``log(rev / work)`` round by round: what the paired interval reads."""
    return [math.log(r) - math.log(w) for r, w in zip(rev, work) if r > 0 and w > 0]


def rounds_to_decide(diffs: Sequence[float], tolerance: float, most: int = 10_000) -> int | None:
    """About how many rounds in all the paired interval needs to decide at the noise these
    rounds show (its half-width below the estimate's distance to the tolerance); ``None``
    when they cannot tell (fewer than 2 rounds, or the estimate on the tolerance)."""
    n = len(diffs)
    if n < 2:
        return None
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    margin = abs(mean - math.log(1 / (1 - tolerance)))
    if margin == 0:
        return None
    if sd == 0:
        return n
    return pairs_needed(sd, margin, n, most)


def rev_verdict(rev: Sequence[float], work: Sequence[float], tolerance: float, commit: str = "", name: str = "",
                failure: dict[str, Any] | None = None) -> RevResult:
    """The gate's verdict on the working tree against the revision, by the one rule on the
    paired interval: ``regression`` when it shows the working tree slower beyond the
    tolerance, ``pass`` when it shows it within, else ``undecided`` with how many more
    rounds would likely decide (exit 4)."""
    out = RevResult(name, commit, tolerance, "broken", failure, rates={"rev": list(rev), "work": list(work)},
                    rounds=min(len(rev), len(work)))
    if failure is not None:
        return out
    diffs = log_ratios(rev, work)
    s = paired(diffs)
    out.slowdown = s.to_json() if s is not None else None
    verdict = decision.judge(s, tolerance)
    if verdict == decision.KEEP:
        out.verdict = "regression"
    elif verdict == decision.DROP:
        out.verdict = "pass"
    else:
        total = rounds_to_decide(diffs, tolerance)
        out.verdict, out.more_rounds = "undecided", (total - len(diffs) if total is not None else None)
    return out
