"""How a trial's exception becomes a recorded state and a one-line reason."""

from __future__ import annotations

import traceback

import torch

from tuner.config.errors import TrialError
from tuner.trial.result import State


class TrialStop(Exception):
    """Ends a trial on every rank at once, with an agreed state and reason."""

    def __init__(self, state: State, reason: str) -> None:
        super().__init__(reason)
        self.state, self.reason = state, reason
        self.pruned_at: tuple[int, float] | None = None
        """(measured steps, samples/s) when the stop is a pruning."""


def classify(exc: BaseException) -> tuple[State, str]:
    """(state, one-line reason) for a trial's exception."""
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0][:500] if text else type(exc).__name__
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text.lower() \
            or "can't allocate memory" in text.lower():
        return State.OOM, first
    if isinstance(exc, TrialError):
        return State.ERROR, first
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return State.ERROR, first + where
