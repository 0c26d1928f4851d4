"""The tuner's study interface: ask, tell, enqueue, records, attributes; Optuna behind it.

The search talks to a :class:`Study`; only this module, :mod:`tuner.study.backend` (its
storage and trial ids) and :mod:`tuner.study.storage` (storage faults) import Optuna, a test
holds it so (``tests/structure/test_layers.py``). What the search reads of a trial is a
:class:`~tuner.study.trial_record.Record`; what it writes to a trial in flight goes through
:class:`Asked`. Changing the sampler, or the study behind it, is this module's business alone.
Optuna's study stays reachable as :attr:`Study.optuna`, for a user who wants its plots.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from tuner.harness import interrupt
from tuner.inputs.errors import RecipeError
from tuner.study import backend
from tuner.study import storage as storage_mod
from tuner.study.trial_record import Record, Status

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

Finished = optuna.exceptions.UpdateFinishedTrialError
"""Raised writing to a trial another worker has ended meanwhile."""
Exists = optuna.exceptions.DuplicatedStudyError
"""Raised creating a study whose name is taken (the finishing lock's one winner)."""

_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")  # Optuna >= 5
OPEN_ATTEMPTS = 5
"""Tries at opening the storage while another process is creating the same one."""


def record_of(trial: "FrozenTrial") -> Record:
    """Optuna's trial as the tuner's record (attributes shared, not copied)."""
    return Record(trial.number, backend.trial_id(trial), Status(trial.state.name.lower()), trial.value,
                  trial.user_attrs, trial.datetime_start,
                  trial.duration.total_seconds() if trial.duration is not None else None)


def _constraints(trial: "FrozenTrial") -> list[float]:
    """The constraints function of Optuna < 5: > 0 means infeasible."""
    return [float(trial.user_attrs.get("constraint", 0.0))]


class Asked:
    """A trial asked of the study and not yet told: what the search writes while it runs."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.optuna = trial
        """Optuna's trial behind this one."""
        self.number: int = trial.number
        self.id: int = backend.trial_id(trial)

    @property
    def attrs(self) -> Mapping[str, Any]:
        return self.optuna.user_attrs

    def set(self, key: str, value: Any) -> None:
        self.optuna.set_user_attr(key, value)

    def choose(self, name: str, values: Sequence[Any]) -> Any:
        """One knob's value, from the sampler (or the enqueued trial's fixed one)."""
        return self.optuna.suggest_categorical(name, list(values))

    def constrain(self, value: float) -> None:
        """Feasible (<= 0) or infeasible (> 0), for the sampler."""
        self.set("constraint", value)
        if _SET_CONSTRAINT:
            self.optuna.set_constraint("memory", value)

    def report(self, value: float, step: int) -> None:
        """An intermediate value (a pruned trial's rate where it was cut)."""
        self.optuna.report(value, step)


class Study:
    """One search's study: its trials, their records, and the sampler that proposes them."""

    def __init__(self, inner: optuna.Study) -> None:
        self.optuna = inner
        """Optuna's study behind this one (its visualisation and importance work on it)."""

    def release(self) -> None:
        """Close the storage's pooled connections (a database file left open by a library
        call is the caller's to carry); the study reconnects if used again."""
        backend.release(self.optuna)

    # --- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, name: str, storage: str, seed: int) -> "Study":
        """Create or resume the study named ``name`` in ``storage`` (a lock or a server not up
        yet is waited out; a full disk or a damaged file is said in one line)."""
        database = storage_mod.sqlite_file(storage)
        if database is not None:
            database.parent.mkdir(parents=True, exist_ok=True)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=4, multivariate=True, group=True, constant_liar=True,
                constraints_func=None if _SET_CONSTRAINT else _constraints)
        place = storage_mod.where(storage)

        def connect() -> Any:
            for _ in range(OPEN_ATTEMPTS - 1):
                try:
                    return storage_mod.rdb(storage)
                except Exception as exc:
                    if not storage_mod.racing(exc):
                        raise
                    time.sleep(0.5)
            return storage_mod.rdb(storage)

        try:
            resilient = storage_mod.Resilient(storage_mod.retrying(connect, place), place)
            inner = backend.keep(optuna.create_study(study_name=name, storage=resilient, direction="maximize",
                                                     sampler=sampler, load_if_exists=True), resilient)
        except storage_mod.StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad URL, a missing driver
            raise RecipeError(
                f"storage: cannot open {storage!r}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}; "
                "give an Optuna storage URL such as sqlite:///runs/NAME/study.db") from None
        if inner.metric_names is None:  # named so, a study browser labels its axis with it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                inner.set_metric_names(["samples_per_s"])
        return cls(inner)

    @classmethod
    def load(cls, url: str, prefer: str | None = None) -> "Study":
        """The one search study of ``url`` (``prefer``: its name, where there are several)."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            summaries = optuna.get_all_study_summaries(url)
        except Exception as exc:  # noqa: BLE001 - any storage failure is the user's URL or file
            raise RecipeError(f"--storage {url}: cannot open it ({type(exc).__name__}: {exc})") from None
        names = [s.study_name for s in summaries if not s.study_name.endswith(".finishing")]  # a workers' lock
        if not names:
            raise RecipeError(f"{url} holds no study")
        if len(names) > 1 and prefer not in names:
            raise RecipeError(f"{url} holds several studies ({', '.join(names)}): give the run folder named after one")
        return cls(optuna.load_study(study_name=prefer if len(names) > 1 else names[0], storage=url))

    # --- reading ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.optuna.study_name

    @property
    def attrs(self) -> Mapping[str, Any]:
        """The study's own attributes (the search's result, the finishing lock's holder)."""
        return self.optuna.user_attrs

    def set_attr(self, key: str, value: Any) -> None:
        self.optuna.set_user_attr(key, value)

    def records(self, *statuses: Status) -> list[Record]:
        """Every trial (or those in ``statuses``), in number order."""
        states = tuple(TrialState[s.name] for s in statuses) or None
        return [record_of(t) for t in self.optuna.get_trials(deepcopy=False, states=states)]

    def read(self, trial: Record | Asked) -> Record:
        """One trial as the storage holds it now (another worker may have written it)."""
        return record_of(backend.read(self.optuna, trial.id))

    def importance(self) -> dict[str, float]:
        """Optuna's knob importance over the finished trials (raises where they are too uniform)."""
        with warnings.catch_warnings():  # "some regimes have < 2 trials"
            warnings.simplefilter("ignore")
            return dict(optuna.importance.get_param_importances(self.optuna))

    # --- the trial in flight ----------------------------------------------------------------

    def enqueue(self, params: Mapping[str, Any], attrs: Mapping[str, Any], skip_if_exists: bool = False) -> None:
        """A trial the sampler's next ``ask`` returns with these knobs (before sampling)."""
        self.optuna.enqueue_trial(dict(params), user_attrs=dict(attrs), skip_if_exists=skip_if_exists)

    def ask(self, who: Mapping[str, Any] | None = None) -> Asked:
        """The next trial: an enqueued one first, else the sampler's. ``who`` (the worker) is
        stamped at once, before its claim, so a process killed between the two leaves a trial
        others can tell is dead; a Ctrl-C between the two is held until the stamp is written.
        Optuna's warning that heartbeats are meant for ``optimize`` is silenced: the workers beat
        for the asked trial themselves.
        """
        with interrupt.deferred():
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Heartbeat of storage")
                asked = Asked(self.optuna.ask())
            if who is not None:
                asked.set("worker", dict(who))
        if interrupt.pressed():
            raise KeyboardInterrupt
        return asked

    def tell(self, asked: Asked, status: Status, value: float | None = None) -> Record:
        """End ``asked`` as ``status`` (COMPLETE with ``value``); :data:`Finished` when another
        worker ended it first."""
        if status == Status.COMPLETE:
            return record_of(self.optuna.tell(asked.optuna, value))
        return record_of(self.optuna.tell(asked.optuna, state=TrialState[status.name]))

    # --- other workers' trials --------------------------------------------------------------

    def set_attr_of(self, trial: Record, key: str, value: Any) -> None:
        """An attribute of any trial of the study, another worker's too."""
        backend.set_attr(self.optuna, trial.id, key, value)

    def fail(self, trial: Record) -> bool:
        """Mark a running trial FAIL; ``False`` when it had already finished meanwhile."""
        return backend.fail(self.optuna, trial.id)

    def beats(self) -> bool:
        return backend.beats(self.optuna)

    def heartbeat(self, trial_id: int) -> None:
        backend.heartbeat(self.optuna, trial_id)

    def fail_stale(self) -> None:
        """Fail the trials whose heartbeat is older than the storage's grace (and put them back)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.optuna)

    def retry(self, trial: Record) -> None:
        """Put a dead worker's trial back, WAITING, once (:func:`tuner.study.backend.retry_stale`)."""
        backend.retry_stale(self.optuna, backend.read(self.optuna, trial.id))

    # --- studies beside this one (the workers' finishing lock) ------------------------------

    def sibling(self, name: str) -> "Study":
        """Another study of this one's storage (``KeyError`` if there is none)."""
        return Study(optuna.load_study(study_name=name, storage=backend.storage(self.optuna)))

    def create_sibling(self, name: str) -> "Study":
        """A new study in this one's storage (:data:`Exists` if the name is taken)."""
        return Study(optuna.create_study(study_name=name, storage=backend.storage(self.optuna)))

    def delete_sibling(self, name: str) -> None:
        """Delete another study of this storage (``KeyError`` if there is none)."""
        optuna.delete_study(study_name=name, storage=backend.storage(self.optuna))

