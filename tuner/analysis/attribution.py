"""Which change bought how much: from the baseline to the best, one knob at a time.

The path changes the knobs that differ in a fixed, sensible order (the loader first, then
precision, micro-batch, ZeRO); every configuration on it is measured ``repeats`` times,
interleaved with the others, and its median counts. Gains multiply, so each knob's share
is its share of the log of the total gain: the forward shares add up to 100% by
construction. Leave-one-out (the best with one knob put back) says what each knob is worth
*given the others*; when the two disagree beyond the spread of the repeats, the knobs
interact and the table says so rather than pretending the shares are independent.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tuner.inputs import levers
from tuner.inputs.levers import LEVERS
from tuner.inputs.rules import conflict
from tuner.stats.interval import Slowdown, slowdown

ORDER = levers.by("path")
"""The order the path changes knobs in: what feeds the step first, then the step itself.
Checkpointing comes before the micro-batch: it is what lets the larger one fit."""
RISKS = {name: lever.risk for name, lever in levers.LEVERS.items()}
INTERACTION = 0.25
"""Forward and leave-one-out shares further apart than this (and than the repeats'
spread) mean the knob's worth depends on the others."""


Valid = Callable[[Mapping[str, Any]], bool]
"""Whether a set of knob values is a configuration that can run (``None``: no conflict
between the knobs; the search adds its layout's rules, which need the world and batch)."""


def _ok(knobs: Mapping[str, Any], valid: Valid | None) -> bool:
    return conflict(knobs) is None and (valid is None or valid(knobs))


def path(baseline: Mapping[str, Any], best: Mapping[str, Any],
         valid: Valid | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``[(knob changed, configuration)]`` from the baseline to the best, baseline first
    (knob ``""``); knobs equal in both are left out. A change that alone would make no
    configuration (ZeRO with FSDP2 still on; a micro-batch the data-parallel share cannot
    hold before the layout that makes room) is taken together with the next one, and the
    step is named by both, joined by ``+``)."""
    steps: list[tuple[str, dict[str, Any]]] = [("", dict(baseline))]
    current, pending = dict(baseline), []
    for knob in changed(baseline, best):
        current = {**current, knob: best[knob]}
        pending.append(knob)
        if _ok(current, valid):
            steps.append(("+".join(pending), dict(current)))
            pending = []
    return steps


def changed(baseline: Mapping[str, Any], best: Mapping[str, Any]) -> list[str]:
    """The knobs that differ, in :data:`ORDER`."""
    return [k for k in ORDER if baseline.get(k, LEVERS[k].default) != best.get(k, LEVERS[k].default)]


def leave_one_out(baseline: Mapping[str, Any], best: Mapping[str, Any],
                  valid: Valid | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``[(step put back, the best with that step's knobs at their baseline values)]``, one
    per step of :func:`path` (a knob that cannot go back alone takes its partner along)."""
    out = []
    for name, _ in path(baseline, best, valid)[1:]:
        config = {**best, **{k: baseline.get(k, LEVERS[k].default) for k in name.split("+")}}
        for other in changed(baseline, best):
            if _ok(config, valid):
                break
            config[other] = baseline.get(other, LEVERS[other].default)
        out.append((name, config))
    return out


def values(config: Mapping[str, Any], name: str) -> Any:
    """A step's knob value in ``config`` (``a / b`` for a step of two knobs)."""
    parts = [config.get(k, LEVERS[k].default) for k in name.split("+")]
    return parts[0] if len(parts) == 1 else " / ".join(map(str, parts))


@dataclass
class Row:
    knob: str
    before: Any
    after: Any
    samples_per_s: float | None
    """Median after this change (``None``: the configuration failed)."""
    gain: float | None
    """samples/s after / before this change."""
    share: float | None
    """This change's share of the total gain (log scale; the forward shares add up to 1)."""
    without: float | None
    """The best's samples/s with only this knob put back (leave-one-out)."""
    loo_share: float | None
    """What putting it back costs, as a share of the total gain (log scale)."""
    risk: str
    failed: dict[str, Any] | str | None = None
    """Why the configuration never ran: its first failed run's ``state``, ``reason`` and the
    tuner's own ``ruled`` record (:func:`tuner.outputs.trial_words.failed_run` words it); a run
    folder written before the record holds the words."""
    gain_low: float | None = None
    gain_high: float | None = None
    """The interval of ``gain`` (:mod:`tuner.stats.interval`; None without a measured noise)."""
    mark: str | None = None
    """``gain`` / ``loss`` (beyond the tolerance, by the interval), ``negligible`` (inside
    ±tolerance, by the interval) or ``unclear`` (neither), against the search's tolerance."""
    without_slowdown: dict[str, Any] | None = None
    """What putting this knob back costs the best: :meth:`Slowdown.to_json` of the
    leave-one-out against the best."""


def share_text(share: float | None) -> str:
    """A step's share of the speedup as a whole percentage, as the console and report.md print
    it: one that rounds to nothing reads 0%, not "-0%"; ``-`` where the step was not measured."""
    if share is None or math.isnan(share):
        return "-"
    return f"{share if abs(share) >= 0.005 else 0.0:.0%}"


def mark(s: Slowdown | None, tolerance: float) -> str | None:
    """A change's verdict from the interval of how much slower the configuration before it
    is than the one after it."""
    if s is None:
        return None
    if s.low > tolerance:
        return "gain"
    if s.high < -tolerance:
        return "loss"
    if s.low > -tolerance and s.high < tolerance:
        return "negligible"
    return "unclear"


@dataclass
class Attribution:
    baseline: float | None
    best: float | None
    rows: list[Row] = field(default_factory=list)
    repeats: int = 0
    spread: float = 0.0
    """Largest relative half-range of the repeats over all configurations measured."""
    tolerance: float = 0.02
    """The search's tolerance the rows' marks are read against."""
    interacting: list[str] = field(default_factory=list)
    """The steps whose share on the path and share taken away from the best differ by more
    than the noise allows: the knobs interact, the shares are this path's."""
    loo_total: float | None = None
    """The leave-one-out shares added up: 1 where the knobs' effects are independent."""
    batch_norm: bool = False
    """The model holds BatchNorm layers: a micro-batch change changes what it learns."""

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "best": self.best, "repeats": self.repeats, "spread": self.spread,
                "tolerance": self.tolerance, "interacting": self.interacting, "loo_total": self.loo_total,
                "batch_norm": self.batch_norm, "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Attribution":
        return cls(data.get("baseline"), data.get("best"), [Row(**r) for r in data.get("rows", [])],
                   int(data.get("repeats", 0)), float(data.get("spread", 0.0)), float(data.get("tolerance", 0.02)),
                   list(data.get("interacting") or []), data.get("loo_total"), bool(data.get("batch_norm")))


def attribute(
    baseline: Mapping[str, Any],
    best: Mapping[str, Any],
    rates: Mapping[str, Sequence[float]],
    failures: Mapping[str, dict[str, Any]],
    batch_norm: bool = False,
    tolerance: float = 0.02,
    run_wide: tuple[float, int] = (0.0, 0),
    valid: Valid | None = None,
    interval: Callable[[Mapping[str, Any], Mapping[str, Any]], Slowdown | None] | None = None,
) -> Attribution:
    """The table from the measured rates.

    Args:
        rates: samples/s of each repeat, by :func:`key` of the configuration.
        failures: why a configuration never ran, by key.
        batch_norm: the model holds BatchNorm layers (the micro-batch's risk is then what it learns).
        tolerance: the search's tolerance: each row's :func:`mark` is read against it.
        run_wide: the run's pooled spread (:func:`tuner.stats.interval.spread`), for
            configurations without repeats of their own.
        interval: how much slower the second configuration is than the first, with its
            interval (the pool's: paired where both were measured in the same rounds);
            default: unpaired, from ``rates``.
    """
    def between(a: Mapping[str, Any], b: Mapping[str, Any]) -> Slowdown | None:
        if interval is not None:
            return interval(a, b)
        return slowdown(rates.get(key(a), ()), rates.get(key(b), ()), run_wide)

    def median(config: Mapping[str, Any]) -> float | None:
        values = rates.get(key(config))
        return statistics.median(values) if values else None

    forward, loo = path(baseline, best, valid), dict(leave_one_out(baseline, best, valid))
    base_rate, best_rate = median(forward[0][1]), median(best)
    total = math.log(best_rate / base_rate) if base_rate and best_rate else None
    out = Attribution(base_rate, best_rate, repeats=max((len(v) for v in rates.values()), default=0),
                      tolerance=tolerance, batch_norm=batch_norm)
    spreads = [(max(v) - min(v)) / 2 / statistics.median(v) for v in rates.values() if len(v) > 1]
    out.spread = max(spreads, default=0.0)
    previous, before = base_rate, forward[0][1]
    for knob, config in forward[1:]:
        rate = median(config)
        step = between(config, before)
        loo_slowdown = between(best, loo[knob])
        gain = rate / previous if rate and previous else None
        without = median(loo[knob])
        risk = "; ".join(RISKS[k] for k in knob.split("+"))
        out.rows.append(Row(
            knob=knob, before=values(baseline, knob), after=values(best, knob), samples_per_s=rate, gain=gain,
            share=math.log(gain) / total if gain and total else None,
            without=without,
            loo_share=math.log(best_rate / without) / total if without and best_rate and total else None,
            risk=risk, failed=failures.get(key(config)),
            gain_low=1 / (1 - step.low) if step and step.low < 1 else None,
            gain_high=1 / (1 - step.high) if step and step.high < 1 else None,
            mark=mark(step, tolerance),
            without_slowdown=loo_slowdown.to_json() if loo_slowdown else None,
        ))
        previous, before = rate, config
    if total is not None and out.rows:
        threshold = max(INTERACTION, 2 * out.spread / abs(total)) if total else INTERACTION
        out.interacting = [r.knob for r in out.rows if r.share is not None and r.loo_share is not None
                           and abs(r.share - r.loo_share) > threshold]
        out.loo_total = sum(r.loo_share for r in out.rows if r.loo_share is not None)
    return out


def key(config: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={config.get(k, LEVERS[k].default)}" for k in ORDER)
