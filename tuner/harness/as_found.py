"""A library call leaves the caller's process as it found it.

``tuner.measure()`` and ``tuner.search()`` run inside a user's own Python process (a
notebook, a trainer, a test suite). What the tuner changes for its own sake there is put
back when the call returns: the garbage collector (enabled, thresholds; nothing frozen),
the warnings filters, the level, handlers and propagation of every logger that existed
before the call (optuna's verbosity, DeepSpeed's logger), and the environment variables
(a lone process's rendezvous variables, Slurm's node groups). pandas, torch and optuna
never freeze a caller's heap either; only the tuner's own command-line processes, which
own their whole life, use ``gc.freeze`` (:func:`tuner.trial.run.freeze`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import warnings
from typing import Any, Iterator


@contextlib.contextmanager
def as_found() -> Iterator[None]:
    """Snapshot the process-wide state a library may touch; restore it on the way out."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    filters = list(warnings.filters)
    environ = dict(os.environ)
    loggers = {name: _logger_state(logger) for name, logger in _loggers()}
    try:
        yield
    finally:
        (gc.enable if enabled else gc.disable)()
        gc.set_threshold(*thresholds)
        warnings.filters[:] = filters
        # the module's cache of the list: no public way to say it changed
        warnings._filters_mutated()  # type: ignore[attr-defined]  # noqa: SLF001
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        for key, value in environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        for name, logger in _loggers():
            if name in loggers:
                level, handlers, propagate, disabled = loggers[name]
                logger.setLevel(level)
                logger.handlers[:] = handlers
                logger.propagate, logger.disabled = propagate, disabled


def _loggers() -> Iterator[tuple[str, logging.Logger]]:
    yield "", logging.getLogger()
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            yield name, logger


def _logger_state(logger: logging.Logger) -> tuple[int, list[Any], bool, bool]:
    return logger.level, list(logger.handlers), logger.propagate, logger.disabled
