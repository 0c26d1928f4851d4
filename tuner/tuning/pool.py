"""Every measurement of a configuration made in this run, pooled: one number per configuration.

The search trials, its repeats, the finish and the attribution all measure configurations;
the same configuration measured by two of them is one configuration with more samples, not two
figures a report could show side by side. The pool also says how noisy a single measurement is here
(the pooled relative standard deviation of repeated measurements) and so whether two
configurations are apart beyond that noise: what lets the finish stop early and the
attribution skip what it already knows.

Runs of the finish are taken in interleaved rounds, and each run keeps its round: two
configurations measured in the same rounds are compared as pairs (the log-ratio within a
round), so what the machine does to both meanwhile cancels
(:func:`tuner.stats.interval.paired`); a search trial, measured alone, is compared unpaired.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Hashable, Mapping

from tuner.harness.metrics import METRIC_NAMES, median_of, objective_value
from tuner.stats.interval import LogStats, Slowdown, blocked, paired, relative_sd, slowdown, spread

if TYPE_CHECKING:
    from tuner.trial.trial_result import TrialResult

BLOCKED_DOF = 6
"""Degrees of freedom the rounds' own noise needs before a paired interval reads it alone
(t 3.7 at 99%): below it the pairs' interval can come out wider than the pooled unpaired
one and reopen a question already decided.
"""


def key(params: Mapping[str, Any]) -> str:
    """One configuration's identity: every knob, sorted."""
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


@dataclass
class Entry:
    params: dict[str, Any]
    runs: list["TrialResult"] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    """What each run was measured for: ``search``, ``repeat``, ``finish``, ``attribution``."""
    rates: list[float] = field(default_factory=list)
    """The objective of each successful run that measured it (samples/s by default)."""
    stats: LogStats = field(default_factory=LogStats)
    """The log-rates' count, mean and spread, kept as runs come in: what every interval reads."""
    failures: int = 0
    """Runs that did not finish fine."""
    rounds: dict[Hashable, float] = field(default_factory=dict)
    """The log-rate of each successful run taken in an interleaved round, by round."""
    trials: list[int] = field(default_factory=list)
    """The study's numbers of the search trials that measured it (the evidence a decision
    names; the finish's runs are its rounds, counted by an interval's pairs)."""

    def add(self, result: "TrialResult", source: str, round_: Hashable | None = None,
            objective: str = "samples_per_s", trial: int | None = None) -> None:
        self.runs.append(result)
        self.sources.append(source)
        if trial is not None:
            self.trials.append(trial)
        if not result.ok:
            self.failures += 1
        elif result.metrics:
            rate = objective_value(result.metrics, objective)
            if rate is None:  # not measured (energy): no evidence either way
                return
            self.rates.append(rate)
            self.stats.add(rate)
            if round_ is not None and rate > 0:
                self.rounds[round_] = math.log(rate)


_EMPTY = Entry({})


class Pool:
    """The run's measurements, by configuration."""

    def __init__(self, objective: str = "samples_per_s") -> None:
        self.objective = objective
        """What the rates are: samples/s, or samples per joule (the recipe's ``objective``)."""
        self.entries: dict[str, Entry] = {}
        self._blocked: tuple[float, int] | None = None

    def add(self, result: "TrialResult", source: str, round_: Hashable | None = None,
            trial: int | None = None) -> None:
        """Keep a finished measurement (a pruned trial is not one: its window was cut);
        ``round_``: the interleaved round it was taken in (``None``: alone, a search trial);
        ``trial``: the search trial's number in the study."""
        if result.pruned_at is not None:
            return
        entry = self.entries.get(k := key(result.params))
        if entry is None:
            entry = self.entries[k] = Entry(dict(result.params))
        entry.add(result, source, round_, self.objective, trial)
        if round_ is not None:
            self._blocked = None

    def entry(self, params: Mapping[str, Any]) -> Entry:
        return self.entries.get(key(params)) or Entry(dict(params))

    def by_key(self, k: str) -> Entry:
        """:meth:`entry` by its :func:`key` (an empty one when never measured)."""
        return self.entries.get(k) or _EMPTY

    def rates(self, params: Mapping[str, Any]) -> list[float]:
        return self.entry(params).rates

    def median(self, params: Mapping[str, Any]) -> float | None:
        rates = self.rates(params)
        return statistics.median(rates) if rates else None

    def known_noise(self) -> float | None:
        """One run's relative standard deviation, pooled over every configuration measured
        more than once (``None`` while none is: no noise is assumed)."""
        return relative_sd(*self.spread())

    def spread(self) -> tuple[float, int]:
        """The run's pooled log-rate spread (:func:`tuner.stats.interval.spread`)."""
        return spread(e.stats for e in self.entries.values())

    def blocked(self) -> tuple[float, int]:
        """One run's noise from the interleaved rounds, the rounds' shared part taken out
        (:func:`tuner.stats.interval.blocked`): what a paired interval reads."""
        if self._blocked is None:
            self._blocked = blocked((k, r, y) for k, e in self.entries.items() for r, y in e.rounds.items())
        return self._blocked

    def paired_noise(self) -> tuple[float, int]:
        """The run-wide noise a paired interval reads: the rounds' own (:meth:`blocked`) once
        it has :data:`BLOCKED_DOF` degrees of freedom, before that whichever of it and the
        pooled :meth:`spread` has more. The spread keeps the drift between rounds in, so it is
        the wider of the two in expectation: a pair read with it is conservative, never bold."""
        own = self.blocked()
        if own[1] >= BLOCKED_DOF:
            return own
        wide = self.spread()
        return own if own[1] >= wide[1] else wide

    def slowdown(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> Slowdown | None:
        """How much slower ``b`` is than ``a``, with its interval: paired over the rounds
        both were measured in, unpaired where there is none (``None``: no noise measured
        yet, or either not measured)."""
        return self.slowdown_of(key(a), key(b))

    def slowdown_of(self, ka: str, kb: str) -> Slowdown | None:
        """:meth:`slowdown` by the configurations' :func:`key`."""
        ea, eb = self.by_key(ka), self.by_key(kb)
        common = [r for r in ea.rounds if r in eb.rounds]
        if common:
            s = paired([ea.rounds[r] - eb.rounds[r] for r in common], self.paired_noise())
            if s is not None:
                return s
        return slowdown(ea.stats, eb.stats, self.spread())

    def metrics(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The median of every metric over the configuration's successful runs."""
        good = [r.metrics for r in self.entry(params).runs if r.ok and r.metrics]
        if not good:
            return None
        out: dict[str, Any] = {}
        for name in METRIC_NAMES:
            values = [m[name] for m in good if m.get(name) is not None]
            out[name] = median_of(values) if values else None
        return out

    def source(self, params: Mapping[str, Any]) -> dict[str, int]:
        """How many of the configuration's successful runs each purpose measured, in the order
        they first ran: ``{"search": 1, "finish": 3}`` (search, repeat, finish, attribution)."""
        entry = self.entry(params)
        good = [s for r, s in zip(entry.runs, entry.sources) if r.ok and r.metrics]
        return {s: good.count(s) for s in dict.fromkeys(good)}
