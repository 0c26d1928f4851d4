"""Levers that are settings of the whole process (``stage: process`` in the registry):
held for one trial and put back after it, so the next trial in the same process starts
from what the job had (a search runs every trial in one process). Each lever's own
setter and restorer is in its family module (:mod:`tuner.inputs.levers.process`); this
module runs them, and resolves any lever's ``module:function`` reference.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tuner.inputs.levers import LEVERS

if TYPE_CHECKING:
    from tuner.inputs.space import Config

Restore = Callable[[], None]


def resolve(reference: str) -> Callable[..., Any]:
    """A lever's ``apply`` (``module:function``) as the object it names."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def set_process_levers(values: dict[str, Any], only: Any = None) -> list[Restore]:
    """Set every process-wide lever (those in ``only``, when given) to ``values``'; returns
    how to put each back."""
    return [resolve(lever.applied.function)(values[name]) for name, lever in LEVERS.items()
            if lever.applied.stage == "process" and (only is None or name in only)]


@contextlib.contextmanager
def held(config: "Config") -> Iterator[None]:
    """The trial's process-wide levers for the duration of the block, then the process's own."""
    restores: list[Restore] = []
    try:
        restores = set_process_levers(config.params())
        yield
    finally:
        for restore in reversed(restores):
            restore()
