"""What a search found: one type for the Python API, ``best.json``, the report and the
console's last lines (:meth:`SearchResult.to_json` is ``best.json``;
:meth:`SearchResult.from_json` reads it back, as the report does from the study)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from tuner.analysis.attribution import Attribution
from tuner.analysis.cost import per_million
from tuner.analysis.diagnose import Verdict
from tuner.inputs.levers import LEVERS
from tuner.runner import launch_words
from tuner.tuning import summary as summary_mod

if TYPE_CHECKING:
    from tuner.runner import Runner
    from tuner.study.study import Study


@dataclass
class SearchResult:
    """What a search found; ``best``/``baseline`` hold ``{"params", "metrics", "source",
    "failures", "trial"}`` (``best`` also ``command``)."""

    out: Path
    best: dict[str, Any]
    baseline: dict[str, Any]
    speedup: float | None
    target_met: bool
    stopped: str
    """Why the search stopped: target, trials, minutes, converged, exhausted, interrupted,
    broken (the job fails whatever the knobs: :attr:`broken`)."""
    trials: int
    """Trials measured in the study (all runs of this command together)."""
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unmeasured: dict[str, str] = field(default_factory=dict)
    """Why each metric the trials could not measure is null, by name (no energy counter)."""
    diagnosis: dict[str, list[Verdict]] = field(default_factory=dict)
    """``baseline`` and ``best``: why each runs at its speed (:mod:`tuner.analysis.diagnose`)."""
    attribution: Attribution | None = None
    """Which knob bought how much, baseline to best (:mod:`tuner.analysis.attribution`)."""
    name: str = ""
    recipe: str = ""
    """The recipe file's path."""
    memory_budget_gib: float | None = None
    world_size: int = 1
    pruned: int = 0
    """Trials this run cut short."""
    pruning_saved_s: float = 0.0
    """Measuring seconds pruning saved (the rest of each cut window, estimated from its rate)."""
    wall_s: float | None = None
    """Seconds from the search's start in this process to its answer."""
    memory_prediction: dict[str, Any] | None = None
    """How right the memory model's predictions were: median and worst relative error of
    ``predicted_peak_gib`` against the measured peak (:func:`~tuner.harness.metrics.budget_peak`)
    after the first trials."""
    decision: dict[str, Any] | None = None
    """How the answer was decided: the tolerance, the rule, each change kept or dropped with
    its interval (:class:`tuner.tuning.recommend.Decision`)."""
    broken: dict[str, Any] | str | None = None
    """Why the search stopped as ``broken``: the baseline's own error, or the first trials'
    (:func:`tuner.tuning.failing_job.why_broken`; a run folder written before: its line)."""
    noise: dict[str, float] | None = None
    """How noisy one run is here: ``{"ss", "dof"}``, the pooled spread of the log-rates of every
    configuration measured more than once (:func:`tuner.stats.interval.spread`), so that
    ``tuner compare`` judges two runs' difference against both runs' noise."""
    paired: dict[str, Any] | None = None
    """The answer against the baseline over the rounds both ran in, paired: ``{"speedup",
    "low", "high", "pairs"}`` (the ratio and its 99% interval). The speedup above is a ratio of
    medians, which the pairs can read differently."""
    price: float | None = None
    """The recipe's price of a device-hour (``price.gpu_hour``), for the cost per million samples."""
    target: dict[str, float] | None = None
    objective: str = "samples_per_s"
    """What the search and the finish maximised (the recipe's ``objective``); the speedup is samples/s's."""
    """The recipe's target (``samples_per_s``, ``tokens_per_s``), where it sets one."""
    study: "Study | None" = field(default=None, repr=False, compare=False)
    """The study the search ran in (``None`` for a result read back from JSON)."""

    @property
    def summary(self) -> summary_mod.Summary:
        """What the search decided, as data (:mod:`tuner.tuning.summary`; best.json's ``summary``)."""
        return summary_mod.of(self)

    def to_json(self) -> dict[str, Any]:
        """``best.json``'s content (also kept in the study, for ``tuner.report``)."""
        return {
            "params": self.best.get("params"),
            "ran": self.best.get("ran"),  # what the script or its library ran where the params left it
            "metrics": self.best.get("metrics"),
            "predicted_peak_gib": self.best.get("predicted_peak_gib"),
            "trial": self.best.get("trial"),
            "baseline": {"params": self.baseline.get("params"), "metrics": self.baseline.get("metrics")},
            # DESIGN.md's baseline is params and metrics: every run of each, and the trial
            # numbers, beside it (what tuner compare judges noise with)
            "runs": {"best": self.best.get("runs"), "baseline": self.baseline.get("runs")},
            "baseline_trial": self.baseline.get("trial"),
            "noise": self.noise,
            "speedup": self.speedup,
            "speedup_paired": self.paired,
            "target_met": self.target_met,
            "environment": self.environment,
            "source": self.best.get("source"),
            "stopped": self.stopped,
            "broken": self.broken,
            "trials": self.trials,
            "command": self.best.get("command"),
            "recipe": self.recipe,
            "diagnosis": {name: [v.to_json() for v in verdicts] for name, verdicts in self.diagnosis.items()},
            "failures": {"best": self.best.get("failures", 0), "baseline": self.baseline.get("failures", 0)},
            "attribution": self.attribution.to_json() if self.attribution is not None else None,
            "memory_budget_gib": self.memory_budget_gib,
            "world_size": self.world_size,
            "name": self.name,
            "pruning": {"trials": self.pruned, "saved_s": self.pruning_saved_s},
            "wall_s": self.wall_s,
            "memory_prediction": self.memory_prediction,
            "decision": self.decision,
            "target": self.target,
            "summary": self.summary.to_json(),
            "notes": list(self.notes),
            "unmeasured": dict(self.unmeasured),
            "objective": self.objective,
            "price": None if self.price is None else {
                "gpu_hour": self.price,
                "best": per_million(self.best.get("metrics"), self.price, self.world_size),
                "baseline": per_million(self.baseline.get("metrics"), self.price, self.world_size)},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], out: Path) -> "SearchResult":
        """A result read back from :meth:`to_json`'s record (``best.json``, the study)."""
        failures = data.get("failures") or {}
        base = data.get("baseline") or {}
        runs = data.get("runs") if isinstance(data.get("runs"), dict) else {}
        attribution = data.get("attribution")
        return cls(
            out=out,
            best={"params": data.get("params"), "metrics": data.get("metrics"), "source": data.get("source"),
                  "failures": failures.get("best", 0), "command": data.get("command"),
                  "predicted_peak_gib": data.get("predicted_peak_gib"), "runs": runs.get("best"),
                  "trial": data.get("trial"), "ran": data.get("ran")},
            baseline={"params": base.get("params"), "metrics": base.get("metrics"),
                      "failures": failures.get("baseline", 0), "runs": runs.get("baseline"),
                      "trial": data.get("baseline_trial")},
            speedup=data.get("speedup"), paired=data.get("speedup_paired"), target_met=bool(data.get("target_met")),
            stopped=data.get("stopped") or "unknown", broken=data.get("broken"), trials=int(data.get("trials") or 0),
            environment=dict(data.get("environment") or {}),
            diagnosis={name: [Verdict.from_json(v) for v in verdicts]
                       for name, verdicts in (data.get("diagnosis") or {}).items()},
            attribution=Attribution.from_json(attribution) if attribution else None,
            name=data.get("name") or "", recipe=data.get("recipe") or "",
            memory_budget_gib=data.get("memory_budget_gib"), world_size=int(data.get("world_size") or 1),
            pruned=int((data.get("pruning") or {}).get("trials") or 0),
            pruning_saved_s=float((data.get("pruning") or {}).get("saved_s") or 0.0), wall_s=data.get("wall_s"),
            memory_prediction=data.get("memory_prediction"), decision=data.get("decision"), noise=data.get("noise"),
            price=(data.get("price") or {}).get("gpu_hour"), notes=list(data.get("notes") or []),
            unmeasured=dict(data.get("unmeasured") or {}),
            target=data.get("target"), objective=data.get("objective") or "samples_per_s",
        )


def measure_command(recipe: Path, world_size: int, params: Mapping[str, Any],
                    runner: "Runner | None" = None, baseline: Mapping[str, Any] | None = None) -> str:
    """The command that measures ``params`` of the ``recipe`` file again with the harness
    alone (as ``runner``'s trials launch: a script's trial starts its own torchrun; default
    a trial in this process).

    A knob at its lever's default where the ``baseline`` had it too is left out: without a
    ``--set`` the recipe's baseline is what ``tuner.measure`` runs, so it runs that value
    anyway. The DeepSpeed job's line set all 30 knobs, 1,200 characters of which 1 was the
    answer's; a knob away from its default is always set, even at the baseline's value (a
    script's own setting, which a later edit of the script could change)."""
    launch = runner.launch(world_size) if runner is not None else launch_words(world_size)
    sets: list[str] = []
    for name, lever in LEVERS.items():
        value = params[name]
        if baseline is not None and value == lever.default and baseline.get(name, lever.default) == value:
            continue
        sets += ["--set", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
    return " ".join(shlex.quote(x) for x in [*launch, "-m", "tuner.measure", str(recipe), *sets])
