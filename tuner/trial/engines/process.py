"""Levers that are settings of the whole process (``stage: process`` in the registry):
held for one trial and put back after it, so the next trial in the same process starts
from what the job had (a search runs every trial in one process). Each lever's setter
(``Applied.hold``) is in its family module (:mod:`tuner.inputs.levers.process`); this
module runs them.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Collection, Iterator

from tuner.inputs.levers import LEVERS

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan

Restore = Callable[[], None]


def set_process_levers(config: "Plan", only: Collection[str] | None = None) -> list[Restore]:
    """Set every process-wide lever (those in ``only``, when given) to ``config``'s value;
    returns how to put each back."""
    return [lever.applied.hold(getattr(config, name)) for name, lever in LEVERS.items()
            if lever.applied.hold is not None and (only is None or name in only)]


@contextlib.contextmanager
def held(config: "Plan") -> Iterator[None]:
    """The trial's process-wide levers for the duration of the block, then the process's own."""
    restores: list[Restore] = []
    try:
        restores = set_process_levers(config)
        yield
    finally:
        for restore in reversed(restores):
            restore()
