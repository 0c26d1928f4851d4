"""Every measurement of a configuration made in this run, pooled: one number per configuration.

The search trials, the confirmation and the attribution all measure configurations; the
same configuration measured by two of them is one configuration with more samples, not two
figures (seen before pooling: the quick start's report showed its baseline at 400.6
samples/s in "Best vs baseline" and at 235.4 in the attribution table, two measurements of
one configuration in one run). The pool also says how noisy a single measurement is here
(the pooled relative standard deviation of repeated measurements) and so whether two
configurations are apart beyond that noise: what lets the confirmation stop early and the
attribution skip what it already knows.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from tuner.harness.metrics import METRIC_NAMES

if TYPE_CHECKING:
    from tuner.trial.result import TrialResult

NOISE_FLOOR = 0.02
"""The smallest relative noise ever assumed: below this, two configurations are called
apart on luck when their repeats happen to agree closely."""
NOISE_UNKNOWN = 0.10
"""The noise assumed before any configuration has been measured twice (one step's cost
varies 30-50% between processes on a shared 2-core machine; whole windows ~5-10%)."""
Z = 2.0
"""Standard errors the gap between two medians must exceed to call them apart."""


def key(params: Mapping[str, Any]) -> str:
    """One configuration's identity: every knob, sorted."""
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


@dataclass
class Entry:
    params: dict[str, Any]
    runs: list["TrialResult"] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    """What each run was measured for: ``search``, ``confirmation``, ``attribution``."""

    @property
    def rates(self) -> list[float]:
        return [r.metrics["samples_per_s"] for r in self.runs if r.ok and r.metrics]

    @property
    def failures(self) -> int:
        return sum(not r.ok for r in self.runs)


class Pool:
    """The run's measurements, by configuration."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def add(self, result: "TrialResult", source: str) -> None:
        """Keep a finished measurement (a pruned trial is not one: its window was cut)."""
        if result.pruned_at is not None:
            return
        entry = self.entries.setdefault(key(result.params), Entry(dict(result.params)))
        entry.runs.append(result)
        entry.sources.append(source)

    def entry(self, params: Mapping[str, Any]) -> Entry:
        return self.entries.get(key(params)) or Entry(dict(params))

    def rates(self, params: Mapping[str, Any]) -> list[float]:
        return self.entry(params).rates

    def median(self, params: Mapping[str, Any]) -> float | None:
        rates = self.rates(params)
        return statistics.median(rates) if rates else None

    def noise(self) -> float:
        """Relative standard deviation of one measurement, pooled over every configuration
        measured more than once (never below :data:`NOISE_FLOOR`)."""
        known = self.known_noise()
        return NOISE_UNKNOWN if known is None else known

    def known_noise(self) -> float | None:
        """:meth:`noise`, or ``None`` while no configuration has been measured twice."""
        squares, dof = 0.0, 0
        for entry in self.entries.values():
            rates = entry.rates
            if len(rates) < 2:
                continue
            mean = statistics.fmean(rates)
            squares += sum((r / mean - 1.0) ** 2 for r in rates)
            dof += len(rates) - 1
        if dof == 0:
            return None
        return max(NOISE_FLOOR, math.sqrt(squares / dof))

    def gap(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, float] | None:
        """``(relative gap of a's median over b's, the gap the noise alone could make)``."""
        ra, rb = self.rates(a), self.rates(b)
        if not ra or not rb:
            return None
        ma, mb = statistics.median(ra), statistics.median(rb)
        # the median of k samples is ~1.25x noisier than their mean
        margin = Z * 1.25 * self.noise() * math.sqrt(1 / len(ra) + 1 / len(rb))
        return (ma - mb) / max(ma, mb), margin

    def apart(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        """Whether ``a`` is faster than ``b`` beyond the noise."""
        g = self.gap(a, b)
        return g is not None and g[0] > g[1]

    def metrics(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The median of every metric over the configuration's successful runs."""
        good = [r.metrics for r in self.entry(params).runs if r.ok and r.metrics]
        if not good:
            return None
        out: dict[str, Any] = {}
        for name in METRIC_NAMES:
            values = [m[name] for m in good if m.get(name) is not None]
            out[name] = statistics.median(values) if values else None
        return out

    def source(self, params: Mapping[str, Any]) -> str:
        """``"median of 3 runs (1 search trial, 2 confirmation)"``."""
        entry = self.entry(params)
        good = [s for r, s in zip(entry.runs, entry.sources) if r.ok and r.metrics]
        counts = {s: good.count(s) for s in dict.fromkeys(good)}
        parts = ", ".join(f"{n} {'search trial' + ('s' if n > 1 else '') if s == 'search' else s}"
                          for s, n in counts.items())
        return f"median of {len(good)} run{'s' if len(good) != 1 else ''} ({parts})"
