"""How the search records a trial in its study, and which trials count.

Every trial's outcome goes into the study as soon as it is known (SQLite by default), so
a killed search loses at most the trial it was running. Outcomes map onto the study as:

- measured, inside the memory budget: COMPLETE, feasible;
- out of memory, non-finite loss, over the memory budget: COMPLETE with the constraint
  violated (``attrs["constraint"] > 0``), so the sampler learns to avoid the region;
- cut short as clearly slower than the best: PRUNED;
- any other failure (a crash in the task): FAIL, with its reason.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any, Mapping

from tuner.harness.metrics import objective_value
from tuner.study.study import Asked, Finished, Study
from tuner.study.trial_record import Record, Status
from tuner.trial.trial_result import INFEASIBLE, State

if TYPE_CHECKING:
    from tuner.inputs.recipe import Budget
    from tuner.trial.trial_result import TrialResult


def open_study(name: str, storage: str, seed: int) -> tuple[Study, int]:
    """Create or resume the study; returns it and how many trials a killed run left RUNNING
    (now marked FAIL so they never count as results)."""
    study = Study.open(name, storage, seed)
    return study, _fail_left_running(study)


SHOWN = ("samples_per_s", "step_time_p50_s", "step_time_p99_s", "data_wait_share", "peak_mem_gib", "mfu")
"""Metrics kept as flat user attributes too (``metric.NAME``): a study browser (optuna-dashboard)
lists flat values in its trial table, where the ``metrics`` mapping is one long JSON string."""


def _fail_left_running(study: Study) -> int:
    """Mark FAIL the trials a killed search left RUNNING: those of a dead process of this
    host (or of a study recorded before workers were), at once. A RUNNING trial of a live
    process, or of another host, is another worker's: its heartbeats decide
    (:mod:`tuner.study.workers`)."""
    from tuner.study.workers import GRACE_S, alive

    stale = 0
    for t in study.records(Status.RUNNING):
        who = t.get("worker")
        if who is not None and alive(who) is not False:
            continue
        if who is None and t.started and (datetime.now() - t.started).total_seconds() < GRACE_S:
            continue  # asked a moment ago by a worker starting beside this one, not claimed yet
        try:
            study.set_attr_of(t, "state", State.ERROR.value)
            study.set_attr_of(t, "reason", "left running by an interrupted search")
            study.fail(t)
        except Finished:
            continue  # another worker failed it first
        stale += 1
    return stale


def record(study: Study, trial: Asked, result: "TrialResult", budget: "Budget",
           extra: Mapping[str, Any] | None = None, objective: str = "samples_per_s") -> tuple[State, Record]:
    """Tell the study what ``result`` was (over ``budget``'s memory, it is ``over_budget``);
    returns the outcome recorded and the finished trial.

    Another worker may have ended the trial meanwhile (it judged this one dead). Then what
    that worker recorded stands, and is returned: the result stays in this process's pool,
    and the configuration, put back by that worker, is measured again.
    """
    try:
        return _record(study, trial, result, budget, extra, objective)
    except Finished:
        return State(result.state), study.read(trial)


def _record(study: Study, trial: Asked, result: "TrialResult", budget: "Budget",
            extra: Mapping[str, Any] | None, objective: str) -> tuple[State, Record]:
    state, reason, metrics = State(result.state), result.reason, result.metrics
    over = over_budget(metrics, budget) if metrics else None
    if over:
        state, reason = State.OVER_BUDGET, over[1]
    ran = {"ran": result.ran} if result.ran else {}
    # a pruned trial's rate where it was cut: the evidence of a move that did not pay
    cut = {"pruned_at": list(result.pruned_at)} if result.pruned_at is not None else {}
    cut |= {"failure": result.failure} if result.failure else {}
    cut |= {"ruled": result.ruled} if result.ruled and not over else {}  # over the budget: that is the reason
    shown = {f"metric.{name}": metrics[name] for name in SHOWN if metrics and metrics.get(name) is not None}
    for key, value in {"state": state.value, "reason": reason, "metrics": metrics, "params": result.params,
                       "timings": result.timings, "losses": result.losses, **ran, **cut, **(extra or {}),
                       **shown}.items():
        trial.set(key, value)
    value = float(objective_value(metrics, objective) or 0.0)  # the search's objective (samples/s by default)
    if state == State.OK:
        trial.constrain(-1.0)
        return state, study.tell(trial, Status.COMPLETE, value)
    if state in INFEASIBLE:
        trial.constrain(over[0] if over else 1.0)
        return state, study.tell(trial, Status.COMPLETE, value)
    if state == State.PRUNED:
        if result.pruned_at is not None:  # after the trial: the sampler ranks pruned trials by it
            step, rate = result.pruned_at
            trial.report(rate, step)
        return state, study.tell(trial, Status.PRUNED)
    return state, study.tell(trial, Status.FAIL)


def over_budget(metrics: Mapping[str, Any], budget: "Budget") -> tuple[float, str] | None:
    """(how far over, why) when a measured trial breaks the memory budget: the allocator's
    peak, and on a GPU what the process holds there (its CUDA context and NCCL's buffers
    too, which the allocator does not see)."""
    b = budget
    limits = (("peak_mem_gib", b.memory_gib, "memory_gib"), ("gpu_mem_process_gib", b.memory_gib, "memory_gib"),
              ("host_mem_gib", b.host_memory_gib, "host_memory_gib"),
              ("largest_batch_peak_gib", b.memory_gib, "memory_gib"))
    for key, limit, name in limits:
        value = metrics.get(key)
        if limit is not None and value is not None and value > limit:
            typical = metrics.get("peak_mem_gib")
            beside = f" (the window's typical batches peaked at {typical:.2f} GiB)" \
                if key == "largest_batch_peak_gib" and typical is not None else ""
            return value - limit, f"{key} {value:.2f} GiB is over budget.{name} {limit:g} GiB{beside}"
    return None


def measured(study: Study) -> list[Record]:
    """Trials that really ran (duplicates answered from the cache are not counted)."""
    return [t for t in study.records() if t.status != Status.RUNNING and not t.duplicate and t.params is not None]


def feasible(study: Study) -> list[Record]:
    """Measured trials that ran and fit the budget."""
    return [t for t in measured(study) if t.status == Status.COMPLETE and t.outcome == State.OK
            and t.value is not None and not math.isnan(t.value)]


def best_feasible(study: Study) -> Record | None:
    ok = feasible(study)
    return max(ok, key=lambda t: t.value or 0.0) if ok else None
