"""One configuration as the search's result shows it: its numbers (the pooled median of
every run, else its search trial) and its verdicts (corrected by every trial measured)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from tuner.analysis.diagnose import Verdict, diagnose_run
from tuner.analysis.evidence import Compare, Seen, revise
from tuner.analysis.remedies import Here
from tuner.harness.system.environment import cores
from tuner.inputs.plan import Plan
from tuner.inputs.space import Machine, unsupported
from tuner.study import records
from tuner.study.searchspace import params_key
from tuner.trial.trial_result import TrialResult

if TYPE_CHECKING:
    from tuner.study.searchspace import Space
    from tuner.study.study import Study
    from tuner.study.trial_record import Record
    from tuner.tuning.pool import Pool


def verdicts(study: "Study", memory_budget_gib: float | None, environment: Mapping[str, Any],
             params: dict[str, Any] | None, metrics: dict[str, Any] | None,
             ran: Mapping[str, Any] | None = None, here: Here | None = None,
             pooled: Callable[[Mapping[str, Any]], dict[str, Any] | None] | None = None,
             compare: Compare | None = None) -> list[Verdict]:
    """A configuration's verdicts, corrected by every trial of ``study`` measured so far;
    the advice reads what the library ran (``ran``) where ``params`` left a lever to it, and
    suggests only what the search could run (``here``).

    ``pooled``: each configuration's median over every run of it (the pool's), so the
    evidence compares like with like, never a median of four runs with one run.
    ``compare``: the interval between two configurations (the pool's), printed with what the
    evidence claims."""
    if not metrics or not params:
        return []
    if pooled is not None:
        metrics = pooled(params) or metrics
    found = diagnose_run(metrics, {**params, **(ran or {})}, memory_budget_gib, environment, here)
    measured = records.measured(study)
    seen = {params_key(t.params): Seen(t.params, (pooled(t.params) if pooled else None) or t.metrics)
            for t in measured if t.metrics and t.params}
    for t in measured:  # cut as slower than the best: its rate at the cut, nothing else
        if t.params and t.get("pruned_at") and params_key(t.params) not in seen:
            seen[params_key(t.params)] = Seen(t.params, {"samples_per_s": t.get("pruned_at")[1]})
    return revise(found, params, metrics, list(seen.values()), cores(), compare)


def here(space: "Space", machine: Machine, make: Callable[[Mapping[str, Any]], Plan],
         params: Mapping[str, Any], global_batch: int, routes: set[str] | None = None) -> Here:
    """What a search over ``space`` can run from ``params``, for the advice: one lever changed,
    through what the machine rules out (fused attention kernels, TF32, fp8 matmuls on a CPU) and
    the space's refusal rules (the layout, the global batch, the libraries); ``make``: the
    configuration of knobs; ``routes``: the knobs that reach a script (``None``: a task, all)."""

    ruled_out = {(name, value): why for name, value, why, _ in unsupported(machine)}

    def refusal(name: str, value: Any) -> str | None:
        return ruled_out.get((name, value)) or space.refusal(make({**params, name: value}), global_batch)

    return Here(refusal, {k: tuple(v) for k, v in space.choices.items()},
                frozenset(routes) if routes is not None else None)


def ran(params: dict[str, Any] | None, pool: "Pool") -> dict[str, Any]:
    """What the library ran where the configuration ``params`` left a lever to it (a
    script's Trainer runs fused AdamW under ``optimizer_impl: default``)."""
    if params is None:
        return {}
    return TrialResult.ran_of(pool.entry(params).runs)


def of(params: dict[str, Any] | None, pool: "Pool",
       known: Mapping[tuple, "Record"]) -> dict[str, Any]:
    """Params and metrics of one configuration: its pooled median, else its search trial
    (``known``: the study's trials by configuration)."""
    if params is None:
        return {"params": None, "metrics": None, "source": None}
    trial = known.get(params_key(params))
    number = trial.number if trial is not None else None
    metrics = pool.metrics(params)
    predicted = trial.get("predicted_peak_gib") if trial is not None else None
    if metrics is not None:
        runs = [r.metrics for r in pool.entry(params).runs if r.ok and r.metrics]
        out = {"params": params, "metrics": metrics, "source": pool.source(params), "runs": runs,
               "failures": pool.entry(params).failures, "trial": number, "predicted_peak_gib": predicted}
        done = ran(params, pool)
    else:
        assert trial is not None, "a configuration with no measurement"
        out = {"params": params, "metrics": trial.metrics, "source": "search trial", "trial": number,
               "runs": [trial.metrics], "predicted_peak_gib": predicted}
        done = trial.get("ran") or {}
    if done:
        out["ran"] = dict(done)  # what the library or the script ran where the configuration left it
    return out
