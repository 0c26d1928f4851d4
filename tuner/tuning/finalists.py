"""The end of a search: the finalists re-measured against the baseline, and the gain
attributed knob by knob, every configuration interleaved with the others (the same
minutes, the same noise for all)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from tuner.analysis import attribution as attribution_mod
from tuner.analysis.attribution import Attribution
from tuner.config.space import Config
from tuner.harness.metrics import METRIC_NAMES

if TYPE_CHECKING:
    import optuna

    from tuner.trial.result import TrialResult
    from tuner.tuning.events import SearchEvents

FINALISTS = 3
"""Configurations re-measured in the confirmation: one noisy search trial must not pick
the winner (seen on the benchmark: the true best was found, then outrun by a lucky
measurement of a configuration 20% slower)."""

Run = Callable[[Config], "TrialResult"]
"""Measures one configuration (a trial in this process, or a script trial)."""


@dataclass
class Confirmation:
    winner: dict[str, Any]
    """The finalist with the best median: the search's answer."""
    runs: dict[str, list["TrialResult"]]
    """``best`` and ``baseline`` confirmation runs."""


def confirm(finalists: list[dict[str, Any]], baseline: dict[str, Any], repeats: int, run: Run,
            events: "SearchEvents | None") -> Confirmation | None:
    """The finalists and the baseline, interleaved ``repeats`` times. The finalist with the
    best median becomes ``best``."""
    if repeats < 1 or not finalists:
        return None
    configs = [Config(**p) for p in finalists]
    base = Config(**baseline)
    if events:
        events.note(f"confirming: {len(configs)} finalist(s) and the baseline, interleaved, {repeats} time(s) each")
    runs: dict[Config, list[TrialResult]] = {c: [] for c in [base, *configs]}
    for _ in range(repeats):
        for config in runs:
            runs[config].append(run(config))

    def median_rate(config: Config) -> float:
        rates = [r.metrics["samples_per_s"] for r in runs[config] if r.ok and r.metrics]
        return statistics.median(rates) if rates else 0.0

    winner = max(configs, key=median_rate)
    return Confirmation(winner=winner.params(), runs={"best": runs[winner], "baseline": runs[base]})


def attribute(base: dict[str, Any], best: dict[str, Any], repeats: int, run: Run,
              make: Callable[[dict[str, Any]], Config], events: "SearchEvents | None") -> Attribution | None:
    """Every configuration on the baseline-to-best path and every leave-one-out, measured
    ``repeats`` times, interleaved."""
    configs = {attribution_mod.key(c): c for _, c in attribution_mod.path(base, best)}
    configs.update({attribution_mod.key(c): c for _, c in attribution_mod.leave_one_out(base, best)})
    if len(configs) < 2:
        return None
    if events:
        events.note(f"attributing the gain: {len(configs)} configurations, interleaved, {repeats} time(s) each")
    rates: dict[str, list[float]] = {k: [] for k in configs}
    failures: dict[str, str] = {}
    batch_norm = False
    for _ in range(repeats):
        for k, knobs in configs.items():
            if k in failures:
                continue
            result = run(make({n: knobs[n] for n in attribution_mod.ORDER if n in knobs}))
            batch_norm = batch_norm or any("BatchNorm" in n for n in result.notes)
            if result.ok and result.metrics:
                rates[k].append(result.metrics["samples_per_s"])
            else:
                failures[k] = f"{result.state}: {result.reason}"
    return attribution_mod.attribute(base, best, rates, failures, batch_norm)


def end_summary(trial: "optuna.trial.FrozenTrial | None", confirmed: Confirmation | None,
                name: str) -> dict[str, Any]:
    """Params and metrics of best/baseline: the median of the confirmation runs when there
    are any that succeeded, else the search trial's own measurement."""
    if trial is None:
        return {"params": None, "metrics": None, "source": None}
    all_runs = confirmed.runs[name] if confirmed is not None else []
    runs = [r.metrics for r in all_runs if r.ok and r.metrics]
    if runs:
        metrics = {k: (statistics.median([m[k] for m in runs if m[k] is not None])
                       if any(m[k] is not None for m in runs) else None) for k in METRIC_NAMES}
        failures = sum(not r.ok for r in all_runs)
        return {"params": trial.user_attrs["params"], "metrics": metrics,
                "source": f"median of {len(runs)} confirmation runs",
                "failures": failures, "trial": trial.number}
    return {"params": trial.user_attrs["params"], "metrics": trial.user_attrs["metrics"],
            "source": "search trial", "trial": trial.number}
