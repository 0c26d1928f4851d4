"""The tuner's own record of one trial of a study, as everything outside ``tuner/study`` reads it.

The search, the memory model, the run folder, the report and the trackers read trials; none
of them should depend on how the study stores them. A :class:`Record` is what a trial was:
its number, where it stands (:class:`Status`), its objective, and the attributes the search
wrote (``params``, ``metrics``, ``state``, ``reason``, ``baseline``, ...). It is made from
Optuna's trial in :mod:`tuner.study.study`, the one place that knows Optuna's types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping


class Status(str, enum.Enum):
    """Where a trial stands in the study (Optuna's five trial states, by name)."""

    WAITING = "waiting"
    """Enqueued (the baseline, a guided step, a dead worker's trial put back), not asked yet."""
    RUNNING = "running"
    COMPLETE = "complete"
    """Measured or answered: it has an objective (samples/s; 0 for an infeasible one)."""
    PRUNED = "pruned"
    FAIL = "fail"


@dataclass(frozen=True)
class Record:
    """One trial of a study, as it stood when read."""

    number: int
    """The trial's number in its study (what the search log and trials.csv show)."""
    id: int
    """The trial's id in its storage (what a worker claims and beats for)."""
    status: Status
    value: float | None = None
    """samples/s for a COMPLETE trial."""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    """What the search wrote of the trial (:mod:`tuner.study.records`)."""
    started: datetime | None = None
    duration_s: float | None = None

    @property
    def params(self) -> dict[str, Any] | None:
        """The full configuration it measured (``None``: it never ran)."""
        return self.attrs.get("params")

    @property
    def metrics(self) -> dict[str, Any] | None:
        return self.attrs.get("metrics")

    @property
    def outcome(self) -> str | None:
        """The tuner's outcome (:class:`tuner.trial.trial_result.State`'s value), once recorded."""
        return self.attrs.get("state")

    @property
    def baseline(self) -> bool:
        return bool(self.attrs.get("baseline"))

    @property
    def duplicate(self) -> bool:
        """A proposal answered from an earlier trial: it measured nothing."""
        return "duplicate_of" in self.attrs

    def get(self, key: str, default: Any = None) -> Any:
        """One attribute the search wrote."""
        return self.attrs.get(key, default)
