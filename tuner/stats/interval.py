"""How much slower one configuration is than another, with the interval every decision reads.

Paired where the two were measured in the same interleaved rounds (:func:`paired`): the
within-round log-ratios, so what the machine does to both in a round cancels; unpaired
(:func:`slowdown`) only where no round holds both. Every keep, drop, stop, pass and fail
reads this interval through :mod:`tuner.stats.decision`.

Student's t on the log of the rates (gains multiply; a rate's noise is relative): the
difference of mean log-rates, its standard error from the two configurations' repeats
pooled, or, below :data:`MIN_DOF` degrees of freedom, from every repeated configuration of
the run. With neither there is no interval: nothing is decided on an assumed noise. The
level is :data:`LEVEL` (99%) at each look, since a decision is looked at again as runs come
in; the error rates of the whole procedure are in docs/search.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

from tuner.stats import student_t

LEVEL = 0.99
"""Two-sided confidence of the interval at one look (each bound a 99.5% one-sided bound)."""
MIN_DOF = 2
"""Degrees of freedom the pair's own repeats must give before they alone set the noise."""


def t_quantile(dof: int) -> float:
    """Student's t quantile at :data:`LEVEL` (:mod:`tuner.stats.student_t`)."""
    return student_t.t_quantile(dof, LEVEL)


def pairs_needed(spread: float, margin: float, start: int, most: int) -> int | None:
    """The fewest pairs ``k`` in ``[start, most)`` whose paired interval, at a log-ratio
    standard deviation of ``spread``, is narrower than ``margin`` (``t(k-1) * spread /
    sqrt(k) < margin``); ``None`` where none is. The gate's "more rounds would likely decide"
    and the finish's projection both read it."""
    return next((k for k in range(start, most) if t_quantile(k - 1) * spread / math.sqrt(k) < margin), None)


class LogStats:
    """Count, mean and sum of squared deviations of one configuration's log-rates: what an
    interval needs of its runs, kept up to date one run at a time (Welford's update)."""

    __slots__ = ("n", "mean", "ss")

    def __init__(self, n: int = 0, mean: float = 0.0, ss: float = 0.0) -> None:
        self.n, self.mean, self.ss = n, mean, ss

    def add(self, rate: float) -> "LogStats":
        """Count one more run (in place; returns itself)."""
        if rate > 0:
            x = math.log(rate)
            self.n += 1
            delta = x - self.mean
            self.mean += delta / self.n
            self.ss += delta * (x - self.mean)
        return self

    @classmethod
    def of(cls, rates: Iterable[float]) -> "LogStats":
        out = cls()
        for r in rates:
            out.add(r)
        return out

    def __repr__(self) -> str:
        return f"LogStats(n={self.n}, mean={self.mean:.6g}, ss={self.ss:.6g})"


def spread(groups: Iterable[Sequence[float] | LogStats]) -> tuple[float, int]:
    """``(sum of squares, degrees of freedom)`` of the log-rates around each group's mean,
    pooled over the groups measured more than once."""
    ss, dof = 0.0, 0
    for group in groups:
        stats = group if isinstance(group, LogStats) else LogStats.of(group)
        if stats.n > 1:
            ss += stats.ss
            dof += stats.n - 1
    return ss, dof


def relative_sd(ss: float, dof: int) -> float | None:
    """One run's relative standard deviation from a pooled :func:`spread` (None without any)."""
    return math.sqrt(ss / dof) if dof > 0 else None


@dataclass(frozen=True)
class Slowdown:
    """``1 - rate_b / rate_a``: how much slower ``b`` is than ``a`` (negative: faster)."""

    estimate: float
    low: float
    high: float
    runs: tuple[int, int]
    dof: int
    """Degrees of freedom of the noise estimate behind the interval."""
    pairs: int = 0
    """Interleaved rounds both were measured in, when the interval is theirs (0: unpaired)."""

    @property
    def half_log(self) -> float:
        """Half the interval's width on the log scale: how precisely it is known."""
        return (math.log(1 - self.low) - math.log(1 - self.high)) / 2 if self.high < 1 else math.inf

    def within(self, tolerance: float) -> bool:
        """``b`` costs less than ``tolerance``, shown by the interval: it may replace ``a``."""
        return self.high < tolerance

    def beyond(self, tolerance: float) -> bool:
        """``b`` is slower than ``a`` by more than ``tolerance``, shown by the interval."""
        return self.low > tolerance

    def decided(self, tolerance: float) -> bool:
        """More runs would not change the verdict against ``tolerance``."""
        return self.within(tolerance) or self.beyond(tolerance)

    @property
    def gains(self) -> tuple[float, float, float]:
        """The estimate and the interval read the other way, as what ``a`` gains over ``b``
        (``rate_a / rate_b - 1``; infinite where ``b`` may not run at all)."""
        def gain(slower: float) -> float:
            return 1 / (1 - slower) - 1 if slower < 1 else math.inf

        return gain(self.estimate), gain(self.low), gain(self.high)

    def to_json(self) -> dict[str, float | int | list[int]]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "runs": list(self.runs),
                "dof": self.dof, "level": LEVEL, "pairs": self.pairs}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Slowdown":
        runs = data.get("runs") or (0, 0)
        return cls(float(data["estimate"]), float(data["low"]), float(data["high"]), (int(runs[0]), int(runs[1])),
                   int(data.get("dof") or 0), int(data.get("pairs") or 0))


def slowdown(a: Sequence[float] | LogStats, b: Sequence[float] | LogStats,
             run_wide: tuple[float, int] = (0.0, 0)) -> Slowdown | None:
    """How much slower ``b``'s rates are than ``a``'s, with the :data:`LEVEL` t-interval.

    Args:
        a, b: samples/s of each run of the two configurations (or their :class:`LogStats`).
        run_wide: :func:`spread` over every configuration of the run, used while the two
            configurations' own repeats give fewer than :data:`MIN_DOF` degrees of freedom.
    """
    sa = a if isinstance(a, LogStats) else LogStats.of(a)
    sb = b if isinstance(b, LogStats) else LogStats.of(b)
    if not sa.n or not sb.n:
        return None
    ss, dof = spread((sa, sb))
    if dof < MIN_DOF and run_wide[1] > dof:
        ss, dof = run_wide
    if dof < 1:
        return None
    diff = sa.mean - sb.mean  # log(rate_a / rate_b)
    half = t_quantile(dof) * math.sqrt(ss / dof) * math.sqrt(1 / sa.n + 1 / sb.n)
    return Slowdown(_slower(diff), _slower(diff - half), _slower(diff + half), (sa.n, sb.n), dof)


def paired(diffs: Sequence[float], run_wide: tuple[float, int] = (0.0, 0)) -> Slowdown | None:
    """How much slower ``b`` is than ``a`` from ``log(rate_a / rate_b)`` within each
    interleaved round both were measured in, with the :data:`LEVEL` t-interval.

    The noise of a difference is the pair's own (``n - 1`` degrees of freedom) or, where it
    has more degrees of freedom, twice one run's noise from ``run_wide`` (:func:`blocked`: the
    run's rounds with their shared part taken out), so a decision of few rounds is not
    stuck on a t quantile of 2 degrees of freedom (9.9) while the run knows its noise well."""
    n = len(diffs)
    if n == 0:
        return None
    mean, own_ss = _moments(diffs)
    own_dof = n - 1
    if run_wide[1] > own_dof:
        var, dof = 2 * run_wide[0] / run_wide[1], run_wide[1]
    elif own_dof >= 1:
        var, dof = own_ss / own_dof, own_dof
    else:
        return None
    half = t_quantile(dof) * math.sqrt(var / n)
    return Slowdown(_slower(mean), _slower(mean - half), _slower(mean + half), (n, n), dof, pairs=n)


def blocked(runs: Iterable[tuple[Hashable, Hashable, float]]) -> tuple[float, int]:
    """``(sum of squares, degrees of freedom)`` of one run's log-rate noise from runs taken in
    interleaved rounds: ``(configuration, round, log-rate)`` fitted as configuration plus round
    (the round's share is what the machine did to all of it), the residuals' squares summed.
    Degrees of freedom: runs less configurations less rounds plus connected groups."""
    data = [(c, r, y) for c, r, y in runs]
    if len(data) < 3:
        return 0.0, 0
    configs = {c for c, _, _ in data}
    rounds = {r for _, r, _ in data}
    effect = {c: 0.0 for c in configs}
    shift = {r: 0.0 for r in rounds}
    for _ in range(100):  # back-fitting: each pass the means of what the other leaves
        before = dict(effect)
        effect = _means((c, y - shift[r]) for c, r, y in data)
        shift = _means((r, y - effect[c]) for c, r, y in data)
        if max(abs(effect[c] - before[c]) for c in configs) < 1e-12:
            break
    ss = math.fsum((y - effect[c] - shift[r]) ** 2 for c, r, y in data)
    dof = len(data) - len(configs) - len(rounds) + _groups(data)
    return (ss, dof) if dof > 0 else (0.0, 0)


def _means(pairs: Iterable[tuple[Hashable, float]]) -> dict[Hashable, float]:
    sums: dict[Hashable, list[float]] = {}
    for k, y in pairs:
        sums.setdefault(k, []).append(y)
    return {k: math.fsum(v) / len(v) for k, v in sums.items()}


def _groups(data: Sequence[tuple[Hashable, Hashable, float]]) -> int:
    """Connected groups of configurations and rounds (one measured in the other links them)."""
    parent: dict[tuple[int, Hashable], tuple[int, Hashable]] = {}

    def find(x: tuple[int, Hashable]) -> tuple[int, Hashable]:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for c, r, _ in data:
        parent[find((0, c))] = find((1, r))
    return len({find(x) for x in list(parent)})


def contrast(now: Sequence[float], then: tuple[LogStats, LogStats],
             then_wide: tuple[float, int] = (0.0, 0)) -> Slowdown | None:
    """How much smaller the ratio ``a / b`` is now than it was then (``1 - ratio_now /
    ratio_then``), with the :data:`LEVEL` t-interval: the regression gate's question.

    ``now`` holds this run's ``log(rate_a / rate_b)`` of each interleaved round (paired, ``n -
    1`` degrees of freedom); ``then`` the record's two groups, unpaired, with their own noise or,
    below :data:`MIN_DOF` degrees of freedom, the recorded run's (``then_wide``). Each side's
    noise is its own, added as variances (Welch, Satterthwaite's degrees of freedom): a quiet
    record's noise must not set the width for rounds measured on a busy machine. Below
    :data:`MIN_DOF` degrees of freedom of the rounds' own, no interval.
    """
    n = len(now)
    if n - 1 < MIN_DOF or then[0].n == 0 or then[1].n == 0:
        return None
    now_mean, now_ss = _moments(now)
    now_var = now_ss / (n - 1) / n
    ss, dof = spread(then)
    if dof < MIN_DOF and then_wide[1] > dof:
        ss, dof = then_wide
    if dof < 1:
        return None
    then_var = ss / dof * (1 / then[0].n + 1 / then[1].n)
    total = now_var + then_var
    if total <= 0:
        welch = n - 1 + dof
    else:
        welch = max(1, int(total**2 / (now_var**2 / (n - 1) + then_var**2 / dof)))
    diff = (then[0].mean - then[1].mean) - now_mean  # log(ratio_then / ratio_now)
    half = t_quantile(welch) * math.sqrt(total)
    return Slowdown(_slower(diff), _slower(diff - half), _slower(diff + half), (n, min(then[0].n, then[1].n)),
                    welch, pairs=n)


def _moments(diffs: Sequence[float]) -> tuple[float, float]:
    """The mean of a run's per-round differences and their sum of squared deviations (what
    :func:`paired` and :func:`contrast` read of the rounds measured now)."""
    mean = math.fsum(diffs) / len(diffs)
    return mean, math.fsum((d - mean) ** 2 for d in diffs)


def _slower(log_ratio: float) -> float:
    """``1 - b / a`` from ``log(a / b)``."""
    return 1 - math.exp(-log_ratio)
