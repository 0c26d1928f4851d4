"""The Optuna study behind a search: its space, its sampler, and how trials are recorded.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import optuna
from optuna.trial import TrialState

from tuner.errors import RecipeError
from tuner.space import KNOBS, Config, Machine, make_config, restrict, unsupported

if TYPE_CHECKING:
    from tuner.recipe import Recipe
    from tuner.trial import TrialResult

LOADER_ONLY = ("prefetch_factor", "persistent_workers")
"""Knobs that only exist when ``num_workers > 0``: suggested conditionally."""

INFEASIBLE_STATES = ("oom", "nonfinite", "over_budget", "imprecise")
"""Outcomes recorded as COMPLETE with the constraint violated."""


@dataclass(frozen=True)
class Space:
    """What the search chooses from: every knob with its candidate values."""

    choices: dict[str, tuple[Any, ...]]
    notes: tuple[str, ...] = ()

    def configs(self, global_batch_size: int, world_size: int, machine: Machine, engine: str) -> list[Config]:
        """Every distinct configuration (loader-only knobs collapse without workers)."""
        import itertools

        keys = list(self.choices)
        out: list[Config] = []
        for values in itertools.product(*(self.choices[k] for k in keys)):
            config, _ = make_config(dict(zip(keys, values)), global_batch_size, world_size, machine, engine)
            if config not in out:
                out.append(config)
        return out


def build_space(recipe: "Recipe", machine: Machine) -> Space:
    """The recipe's space on this machine. A searched knob (a list) also holds the
    baseline's value, so the baseline is a point of the search; a fixed knob (a scalar)
    stays fixed; an omitted knob stays at the baseline's value; ``--set`` fixes a knob."""
    base = _baseline_values(recipe)
    choices: dict[str, tuple[Any, ...]] = {}
    for name in KNOBS:
        values = list(recipe.space.get(name, ()))
        if not values:
            values = [base[name]]
        elif len(values) > 1 and base[name] not in values:
            values.insert(0, base[name])
        choices[name] = tuple([recipe.knob_overrides[name]] if name in recipe.knob_overrides else values)
    restricted, notes = restrict(choices, machine)
    return Space(restricted, tuple(notes))


def _baseline_values(recipe: "Recipe") -> dict[str, Any]:
    """Defaults <- the recipe's baseline <- ``--set``; no accumulation unless told."""
    knobs = {name: knob.default for name, knob in KNOBS.items()}
    knobs["micro_batch_size"] = recipe.global_batch_size // recipe.world_size
    knobs.update(recipe.baseline)
    knobs.update(recipe.knob_overrides)
    return knobs


def baseline_knobs(recipe: "Recipe", space: Space, machine: Machine) -> dict[str, Any]:
    """The user's current configuration, measured as it is even where the space fixes a
    knob to another value; only what this machine cannot run is replaced."""
    knobs = _baseline_values(recipe)
    for name, value, _why, fallback in unsupported(machine):
        if knobs[name] == value:
            knobs[name] = fallback
    return knobs


WAIT_WORTH_FIXING = 0.05
"""A data-wait share above this says the loader is (part of) the bottleneck."""
COORDINATE_ORDER = ("amp_dtype", "micro_batch_size", "zero_stage", "num_workers", "prefetch_factor",
                    "persistent_workers", "pin_memory")
"""Knobs tried one at a time around the best so far, the likeliest large effects first."""


def guided_next(space: Space, incumbent: Mapping[str, Any], metrics: Mapping[str, Any],
                tried: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The method, before the sampler: locate the bottleneck, change one thing at a time.

    From the best configuration so far (``incumbent``, with its ``metrics``): while the
    loop waits on data, the next larger number of loader workers (persistent, deepest
    prefetch); a step up that did not win ends the climb, since the incumbent then still
    has fewer workers. Then each other value of each knob, one knob at a time; larger
    micro-batches first (fewer accumulation steps, fuller kernels; an OOM is just an
    infeasible trial). Returns the first such neighbour not yet ``tried``, or ``None``
    when the neighbourhood is exhausted and the sampler takes over.
    """
    c = space.choices
    start = {k: v if v in c[k] else c[k][0] for k, v in incumbent.items() if k in c}
    more = sorted(w for w in c["num_workers"] if w > start["num_workers"])
    if (metrics.get("data_wait_share") or 0.0) > WAIT_WORTH_FIXING and more:
        candidate = dict(start, num_workers=more[0], prefetch_factor=max(c["prefetch_factor"]))
        if True in c["persistent_workers"]:
            candidate["persistent_workers"] = True
        if not tried(candidate):
            return candidate
    for name in COORDINATE_ORDER:
        values = sorted(c[name], reverse=True) if name == "micro_batch_size" else c[name]
        for value in values:
            candidate = dict(start, **{name: value})
            if value != start[name] and not tried(candidate):
                return candidate
    return None


def suggest(trial: optuna.Trial, space: Space, baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Ask the sampler for one point; loader-only knobs only when there are workers. The
    enqueued baseline trial keeps the baseline's values for knobs the space fixes."""
    if trial.user_attrs.get("baseline"):
        space = Space({k: (baseline[k],) if len(v) == 1 else v for k, v in space.choices.items()})
    knobs: dict[str, Any] = {}
    for name, values in space.choices.items():
        if name in LOADER_ONLY:
            continue
        knobs[name] = trial.suggest_categorical(name, list(values)) if len(values) > 1 else values[0]
    for name in LOADER_ONLY:
        values = space.choices[name]
        if knobs["num_workers"] > 0 and len(values) > 1:
            knobs[name] = trial.suggest_categorical(name, list(values))
        else:
            knobs[name] = values[0] if knobs["num_workers"] > 0 else KNOBS[name].default
    return knobs


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


def open_study(recipe: "Recipe", storage: str, seed: int) -> tuple[optuna.Study, int]:
    """Create or resume the study; returns it and how many trials a killed run left RUNNING
    (now marked FAIL so they never count as results)."""
    if storage.startswith("sqlite:///"):
        Path(storage[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=4, multivariate=True, group=True,
            constraints_func=None if _SET_CONSTRAINT else constraints,
        )
    for attempt in range(OPEN_ATTEMPTS):
        try:
            study = optuna.create_study(
                study_name=recipe.name, storage=storage, direction="maximize", sampler=sampler, load_if_exists=True
            )
            break
        except Exception as exc:  # noqa: BLE001 - a bad URL, a missing driver, an unreachable server
            if _racing(exc) and attempt + 1 < OPEN_ATTEMPTS:
                time.sleep(0.5)
                continue
            raise RecipeError(
                f"storage: cannot open {storage!r}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}; "
                "give an Optuna storage URL such as sqlite:///runs/NAME/study.db"
            ) from None
    stale = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(t._trial_id, "state", "error")
        study._storage.set_trial_user_attr(t._trial_id, "reason", "left running by an interrupted search")
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        stale += 1
    return study, stale


def record(study: optuna.Study, trial: optuna.Trial, result: "TrialResult", recipe: "Recipe",
           extra: Mapping[str, Any] | None = None) -> str:
    """Tell the study what ``result`` was; returns the outcome recorded."""
    state, reason, metrics = result.state, result.reason, result.metrics
    over = over_budget(metrics, recipe) if metrics else None
    if over:
        state, reason = "over_budget", over[1]
    for key, value in {"state": state, "reason": reason, "metrics": metrics, "params": result.params,
                       "timings": result.timings, "losses": result.losses, **(extra or {})}.items():
        trial.set_user_attr(key, value)
    value = float(metrics["samples_per_s"]) if metrics else 0.0
    if state == "ok":
        set_constraint(trial, -1.0)
        study.tell(trial, value)
    elif state in INFEASIBLE_STATES:
        set_constraint(trial, over[0] if over else 1.0)
        study.tell(trial, value)
    elif state == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)
    return state


def over_budget(metrics: Mapping[str, Any], recipe: "Recipe") -> tuple[float, str] | None:
    """(how far over, why) when a measured trial breaks the memory budget."""
    b = recipe.budget
    for key, limit, name in (("peak_mem_gib", b.memory_gib, "memory_gib"), ("host_mem_gib", b.host_memory_gib, "host_memory_gib")):
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
    return [t for t in measured(study) if t.state == TrialState.COMPLETE and t.user_attrs.get("state") == "ok"
            and t.value is not None and not math.isnan(t.value)]


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    ok = feasible(study)
    return max(ok, key=lambda t: t.value) if ok else None


def config_key(config: Config) -> tuple:
    return tuple(sorted(config.params().items()))
