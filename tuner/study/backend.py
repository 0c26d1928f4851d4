"""The one place that reaches past Optuna's public API: a study's storage and a trial's id.

Optuna's public ``Study`` and ``Trial`` cannot do what several workers on one study need:
write a trial of another worker (fail it, with why, when its worker died), read one trial
afresh, beat for the trial in flight. Its storage can, by trial id, and neither the storage
a study holds nor a trial's id is public. So :func:`keep` remembers the storage handle the
tuner builds when it opens a study (:func:`tuner.study.records.open_study`), and only this
module reads a private attribute, in two functions; everything else goes through it.
"""

from __future__ import annotations

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


def set_attr(study: optuna.Study, trial: "optuna.Trial | FrozenTrial", key: str, value: Any) -> None:
    """A user attribute of any trial of the study, another worker's too."""
    storage(study).set_trial_user_attr(trial_id(trial), key, value)


def fail(study: optuna.Study, trial: "optuna.Trial | FrozenTrial") -> bool:
    """Mark a running trial FAIL; ``False`` when it had already finished meanwhile."""
    return bool(storage(study).set_trial_state_values(trial_id(trial), TrialState.FAIL))


def read(study: optuna.Study, trial: "optuna.Trial | FrozenTrial") -> "FrozenTrial":
    """The trial as the storage holds it now."""
    return storage(study).get_trial(trial_id(trial))


def beats(study: optuna.Study) -> bool:
    """Whether the study's storage keeps heartbeats (RDB storage with an interval)."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return bool(is_heartbeat_enabled(storage(study)))


def heartbeat(study: optuna.Study, trial_or_id: "optuna.Trial | FrozenTrial | int") -> None:
    """Record a heartbeat for a running trial (where the storage keeps them)."""
    if beats(study):
        tid = trial_or_id if isinstance(trial_or_id, int) else trial_id(trial_or_id)
        storage(study).record_heartbeat(tid)  # type: ignore[attr-defined]


def load(name: str, study: optuna.Study) -> optuna.Study:
    """Another study (by ``name``) in ``study``'s storage."""
    return optuna.load_study(study_name=name, storage=storage(study))


def create(name: str, study: optuna.Study) -> optuna.Study:
    """A new study in ``study``'s storage (``DuplicatedStudyError`` if it exists)."""
    return optuna.create_study(study_name=name, storage=storage(study))


def delete(name: str, study: optuna.Study) -> None:
    """Delete another study of ``study``'s storage (``KeyError`` if there is none)."""
    optuna.delete_study(study_name=name, storage=storage(study))
