"""The one place that reaches past Optuna's public API: a study's storage and a trial's id.

Optuna's public ``Study`` and ``Trial`` cannot do what several workers on one study need:
write a trial of another worker (fail it, with why, when its worker died), read one trial
afresh, beat for the trial in flight, put a dead worker's trial back. Its storage can, by
trial id, and neither the storage a study holds nor a trial's id is public. So :func:`keep`
remembers the storage handle the tuner builds when it opens a study
(:meth:`tuner.study.study.Study.open`), and only this module reads a private attribute, in
two functions; everything else goes through it.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

if TYPE_CHECKING:
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

_HANDLES: "weakref.WeakKeyDictionary[optuna.Study, BaseStorage]" = weakref.WeakKeyDictionary()


def keep(study: optuna.Study, storage: "BaseStorage") -> optuna.Study:
    """Remember the storage handle ``study`` was opened with; returns the study."""
    _HANDLES[study] = storage
    return study


def storage(study: optuna.Study) -> "BaseStorage":
    """The storage of ``study``: the handle it was opened with, or (a study opened by other
    code, e.g. a test's) the one Optuna keeps."""
    kept = _HANDLES.get(study)
    return kept if kept is not None else study._storage  # noqa: SLF001 - Optuna keeps no public handle


def trial_id(trial: "optuna.Trial | FrozenTrial") -> int:
    """A trial's id in its storage (Optuna's number is per study; the storage's calls take the id)."""
    return int(trial._trial_id)  # noqa: SLF001 - public on neither Trial nor FrozenTrial


def set_attr(study: optuna.Study, tid: int, key: str, value: Any) -> None:
    """A user attribute of any trial of the study, another worker's too."""
    storage(study).set_trial_user_attr(tid, key, value)


def fail(study: optuna.Study, tid: int) -> bool:
    """Mark a running trial FAIL; ``False`` when it had already finished meanwhile."""
    return bool(storage(study).set_trial_state_values(tid, TrialState.FAIL))


def read(study: optuna.Study, tid: int) -> "FrozenTrial":
    """The trial as the storage holds it now."""
    return storage(study).get_trial(tid)


def beats(study: optuna.Study) -> bool:
    """Whether the study's storage keeps heartbeats (RDB storage with an interval)."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return bool(is_heartbeat_enabled(storage(study)))


def heartbeat(study: optuna.Study, tid: int) -> None:
    """Record a heartbeat for a running trial (where the storage keeps them)."""
    if beats(study):
        storage(study).record_heartbeat(tid)  # type: ignore[attr-defined]


def retry_stale(study: optuna.Study, trial: "FrozenTrial") -> None:
    """Put a trial whose worker died back, WAITING, once (Optuna's heartbeat retry; a
    configuration that kills its worker twice is not tried a third time), without the dead
    worker's claim and outcome, and saying why it runs. Also the storage's own callback for
    the trials its heartbeat check fails (:func:`tuner.study.storage.rdb`)."""
    cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
    again = copy.deepcopy(trial)
    kept = {k: v for k, v in trial.user_attrs.items() if k not in ("claim", "worker", "state", "reason")}
    again.user_attrs = {**kept, "why": f"trial {trial.number} again: its worker stopped mid-trial"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls(max_retry=1)(study, again)


def release(study: optuna.Study) -> None:
    """Close the pooled connections of the RDB storage under ``study`` (the wrappers it sits
    in: the tuner's retries, Optuna's cache): a caller's process keeps no file of the study
    open after a search (seen: ``study.db`` open twice after ``tuner.search()``). The engine
    opens a connection again if the study is used later."""
    layer: Any = storage(study)
    for _ in range(8):
        engine = getattr(layer, "engine", None)
        if engine is not None and hasattr(engine, "dispose"):
            engine.dispose()
            return
        layer = getattr(layer, "inner", None) or getattr(layer, "_backend", None)
        if layer is None:
            return

