"""The search's answer as a :class:`~tuner.tuning.search_result.SearchResult`: the
finish's answer and why (:mod:`tuner.tuning.finish`, :mod:`tuner.tuning.recommend`),
one number per configuration from every run of it in this process
(:class:`~tuner.tuning.pool.Pool`; a resumed study's from its search trial), the speedup,
the diagnosis of both ends, the run's noise."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from tuner.memory import model as memory
from tuner.study import records as study_mod
from tuner.tuning import budget, recommend
from tuner.tuning.search_result import SearchResult, measure_command

if TYPE_CHECKING:
    from tuner.analysis.attribution import Attribution
    from tuner.analysis.diagnose import Verdict
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Recipe
    from tuner.inputs.space import Configs
    from tuner.runner import Runner
    from tuner.study.searchspace import Space
    from tuner.study.study import Study
    from tuner.study.workers import Workers
    from tuner.tuning.events import SearchEvents
    from tuner.tuning.finish import Finished
    from tuner.tuning.pool import Pool


class Searched(Protocol):
    """What the answer reads of the search that ran (:class:`~tuner.tuning.decider.Decider`)."""

    recipe: "Recipe"
    space: "Space"
    pool: "Pool"
    study: "Study"
    events: "SearchEvents"
    workers: "Workers"
    runner: "Runner | None"
    baseline_config: "Plan"
    baseline_params: dict[str, Any]
    configs: "Configs"
    reference: list[float] | None
    memory: Any
    pruned: int
    saved_s: float
    started: float
    broken: dict[str, Any] | None
    unmeasured: dict[str, str]

    def summary_of(self, params: dict[str, Any] | None, pool: "Pool") -> dict[str, Any]: ...

    def ruled_out(self, params: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def environment(self) -> dict[str, Any]: ...

    def done(self) -> int: ...

    def valid(self, knobs: Mapping[str, Any]) -> bool: ...

    def verdicts(self, params: dict[str, Any] | None, metrics: dict[str, Any] | None) -> list["Verdict"]: ...


def result(d: Searched, stopped: str, finished: "Finished | None",
           attribution: "Attribution | None") -> SearchResult:
    """What the search found, from the decider's study and pool."""
    pool = d.pool
    notes = list(d.space.notes)
    best_trial = study_mod.best_feasible(d.study)
    best_params = finished.answer if finished is not None else (
        best_trial.params if best_trial is not None else None)
    baseline_trial = next((t for t in study_mod.measured(d.study) if t.baseline), None)
    best = d.summary_of(best_params, pool)
    base = d.summary_of(baseline_trial.params if baseline_trial else None, pool)
    if best["params"]:
        best["command"] = measure_command(d.recipe.path, d.recipe.world_size, best["params"], d.runner,
                                          base["params"])
    speedup = None
    if best["metrics"] and base["metrics"]:
        speedup = best["metrics"]["samples_per_s"] / base["metrics"]["samples_per_s"]
    decision = None
    if best_params is not None:
        decision = recommend.record(best_params, finished, attribution, pool, d.baseline_params,
                                    d.recipe.tolerance, d.configs.normalised, d.space.valid, speedup,
                                    d.ruled_out)
    r = d.recipe
    env = d.environment()
    mixed = d.workers.environments(env)
    if mixed:
        notes.append(mixed)
    return SearchResult(
        out=r.out, best=best, baseline=base, speedup=speedup,
        target_met=bool(best["metrics"]) and budget.meets(best["metrics"], r.target),
        stopped=stopped, trials=d.done(), environment=env, notes=notes, unmeasured=dict(d.unmeasured),
        objective=r.objective,
        diagnosis={name: d.verdicts(part["params"], part["metrics"])
                   for name, part in (("baseline", base), ("best", best))},
        attribution=attribution, name=r.name, recipe=str(r.path), memory_budget_gib=r.budget.memory_gib,
        world_size=r.world_size, pruned=d.pruned, pruning_saved_s=d.saved_s,
        wall_s=time.monotonic() - d.started, study=d.study,
        memory_prediction=d.memory.error(memory.SETTLED_AFTER) if d.memory is not None else None,
        decision=decision.to_json() if decision is not None else None, broken=d.broken, price=r.price.gpu_hour,
        target={k: v for k, v in dataclasses.asdict(r.target).items() if v is not None} or None,
        noise=dict(zip(("ss", "dof"), pool.spread())), paired=_paired(pool, best["params"], base["params"]),
    )


def _paired(pool: "Pool", answer: dict[str, Any] | None, baseline: dict[str, Any] | None) -> dict[str, Any] | None:
    """The answer's speedup over the baseline from the rounds both ran in (the finish's
    pairs), with its interval; ``None`` where they never shared a round."""
    if not answer or not baseline or answer == baseline:
        return None
    s = pool.slowdown(answer, baseline)
    if s is None or not s.pairs:
        return None
    gain, low, high = s.gains
    return {"speedup": 1 + gain, "low": 1 + low, "high": 1 + high, "pairs": s.pairs}

