"""The Optuna study behind a search: its sampler, its storage, and how trials are recorded.

Every trial's outcome goes into the study as soon as it is known (SQLite by default), so
a killed search loses at most the trial it was running. Outcomes map onto Optuna as:

- measured, inside the memory budget: COMPLETE, feasible;
- out of memory, non-finite loss, over the memory budget: COMPLETE with the constraint
  violated (``user_attrs["constraint"] > 0``), so the sampler learns to avoid the region;
- cut short as clearly slower than the best: PRUNED;
- any other failure (a crash in the task): FAIL, with its reason.
"""

from __future__ import annotations

import math
import time
import warnings
from datetime import datetime
from typing import TYPE_CHECKING, Any, Mapping

import optuna
from optuna.trial import TrialState

from tuner.config.errors import RecipeError
from tuner.study import backend
from tuner.study import storage as storage_mod
from tuner.trial.trial_result import INFEASIBLE, State

if TYPE_CHECKING:
    from tuner.config.recipe import Budget
    from tuner.trial.trial_result import TrialResult


_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")  # Optuna >= 5


def constraints(trial: optuna.trial.FrozenTrial) -> list[float]:
    """The constraints function of Optuna < 5: > 0 means infeasible."""
    return [float(trial.user_attrs.get("constraint", 0.0))]


def set_constraint(trial: optuna.Trial, value: float) -> None:
    """Mark a trial feasible (<= 0) or infeasible (> 0) for the sampler."""
    trial.set_user_attr("constraint", value)
    if _SET_CONSTRAINT:
        trial.set_constraint("memory", value)


OPEN_ATTEMPTS = 5
"""Tries at opening the storage while another process is creating the same one."""


def _racing(exc: BaseException) -> bool:
    """Another process opening the same new storage at the same moment (a dashboard, a
    script polling the study) makes the schema creation collide: "table ... already
    exists", "database is locked", two inserts of Alembic's version row (seen: 7 of 40
    simultaneous opens of a new SQLite file failed so, one in CI). Worth another try, as
    the schema is then complete; any other error is not."""
    import sqlalchemy

    cause: BaseException | None = exc
    while cause is not None:
        text = str(cause).lower()
        if isinstance(cause, sqlalchemy.exc.OperationalError):
            return "already exists" in text or "locked" in text
        if isinstance(cause, sqlalchemy.exc.IntegrityError):
            return "alembic_version" in text
        cause = cause.__cause__ or cause.__context__
    return False


def open_study(name: str, storage: str, seed: int) -> tuple[optuna.Study, int]:
    """Create or resume the study; returns it and how many trials a killed run left RUNNING
    (now marked FAIL so they never count as results)."""
    database = storage_mod.sqlite_file(storage)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=4, multivariate=True, group=True, constant_liar=True,
            constraints_func=None if _SET_CONSTRAINT else constraints,
        )
    place = storage_mod.where(storage)

    def connect() -> optuna.storages.BaseStorage:
        for _ in range(OPEN_ATTEMPTS - 1):
            try:
                return storage_mod.rdb(storage)
            except Exception as exc:
                if not _racing(exc):
                    raise
                time.sleep(0.5)
        return storage_mod.rdb(storage)

    try:  # a lock or a server not up yet is waited out; a full disk or a damaged file is said
        resilient = storage_mod.Resilient(storage_mod.retrying(connect, place), place)
        study = backend.keep(optuna.create_study(study_name=name, storage=resilient, direction="maximize",
                                                 sampler=sampler, load_if_exists=True), resilient)
    except storage_mod.StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bad URL, a missing driver
        raise RecipeError(
            f"storage: cannot open {storage!r}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}; "
            "give an Optuna storage URL such as sqlite:///runs/NAME/study.db"
        ) from None
    _name_objective(study)
    return study, _fail_left_running(study)


SHOWN = ("samples_per_s", "step_time_p50_s", "step_time_p99_s", "data_wait_share", "peak_mem_gib", "mfu")
"""Metrics kept as flat user attributes too (``metric.NAME``): a study browser (optuna-dashboard)
lists flat values in its trial table, where the ``metrics`` mapping is one long JSON string."""


def _name_objective(study: optuna.Study) -> None:
    """The objective is samples/s: named so, a study browser labels its axis with it."""
    if study.metric_names is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["samples_per_s"])


def _fail_left_running(study: optuna.Study) -> int:
    """Mark FAIL the trials a killed search left RUNNING: those of a dead process of this
    host (or of a study recorded before workers were), at once. A RUNNING trial of a live
    process, or of another host, is another worker's: its heartbeats decide
    (:mod:`tuner.study.workers`)."""
    from tuner.study.workers import GRACE_S, alive

    stale = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        who = t.user_attrs.get("worker")
        if who is not None and alive(who) is not False:
            continue
        if who is None and t.datetime_start and (datetime.now() - t.datetime_start).total_seconds() < GRACE_S:
            continue  # asked a moment ago by a worker starting beside this one, not claimed yet
        try:
            backend.set_attr(study, t, "state", State.ERROR.value)
            backend.set_attr(study, t, "reason", "left running by an interrupted search")
            backend.fail(study, t)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker failed it first
        stale += 1
    return stale


def record(study: optuna.Study, trial: optuna.Trial, result: "TrialResult", budget: "Budget",
           extra: Mapping[str, Any] | None = None) -> tuple[State, optuna.trial.FrozenTrial]:
    """Tell the study what ``result`` was (over ``budget``'s memory, it is ``over_budget``);
    returns the outcome recorded and the finished trial.

    Another worker may have ended the trial meanwhile (it judged this one dead: a heartbeat
    late on a loaded machine; seen once in CI with two Slurm workers on one host). Then what
    that worker recorded stands, and is returned: the result stays in this process's pool,
    and the configuration, put back by that worker, is measured again."""
    try:
        return _record(study, trial, result, budget, extra)
    except optuna.exceptions.UpdateFinishedTrialError:
        return State(result.state), backend.read(study, trial)


def _record(study: optuna.Study, trial: optuna.Trial, result: "TrialResult", budget: "Budget",
            extra: Mapping[str, Any] | None) -> tuple[State, optuna.trial.FrozenTrial]:
    state, reason, metrics = State(result.state), result.reason, result.metrics
    over = over_budget(metrics, budget) if metrics else None
    if over:
        state, reason = State.OVER_BUDGET, over[1]
    ran = {"ran": result.ran} if result.ran else {}
    shown = {f"metric.{name}": metrics[name] for name in SHOWN if metrics and metrics.get(name) is not None}
    for key, value in {"state": state.value, "reason": reason, "metrics": metrics, "params": result.params,
                       "timings": result.timings, "losses": result.losses, **ran, **(extra or {}), **shown}.items():
        trial.set_user_attr(key, value)
    value = float(metrics["samples_per_s"]) if metrics else 0.0
    if state == State.OK:
        set_constraint(trial, -1.0)
        return state, study.tell(trial, value)
    if state in INFEASIBLE:
        set_constraint(trial, over[0] if over else 1.0)
        return state, study.tell(trial, value)
    if state == State.PRUNED:
        if result.pruned_at is not None:  # after the trial: the sampler ranks pruned trials by it
            step, rate = result.pruned_at
            trial.report(rate, step)
        return state, study.tell(trial, state=TrialState.PRUNED)
    return state, study.tell(trial, state=TrialState.FAIL)


def over_budget(metrics: Mapping[str, Any], budget: "Budget") -> tuple[float, str] | None:
    """(how far over, why) when a measured trial breaks the memory budget: the allocator's
    peak, and on a GPU what the process holds there (its CUDA context and NCCL's buffers
    too, which the allocator does not see)."""
    b = budget
    limits = (("peak_mem_gib", b.memory_gib, "memory_gib"), ("gpu_mem_process_gib", b.memory_gib, "memory_gib"),
              ("host_mem_gib", b.host_memory_gib, "host_memory_gib"))
    for key, limit, name in limits:
        value = metrics.get(key)
        if limit is not None and value is not None and value > limit:
            return value - limit, f"{key} {value:.2f} GiB is over budget.{name} {limit:g} GiB"
    return None


def config_of(trial: optuna.trial.FrozenTrial) -> dict[str, Any] | None:
    """The full configuration a finished trial measured (``None`` if it never ran)."""
    return trial.user_attrs.get("params")


def measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that really ran (duplicates answered from the cache are not counted)."""
    return [t for t in study.get_trials(deepcopy=False)
            if t.state != TrialState.RUNNING and "duplicate_of" not in t.user_attrs and "params" in t.user_attrs]


def feasible(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Measured trials that ran and fit the budget."""
    return [t for t in measured(study) if t.state == TrialState.COMPLETE and t.user_attrs.get("state") == State.OK
            and t.value is not None and not math.isnan(t.value)]


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    ok = feasible(study)
    return max(ok, key=lambda t: t.value) if ok else None
