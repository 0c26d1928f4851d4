"""The experiment trackers a search can log to: the recipe's ``track:`` and ``--track``
(what each does: :mod:`tuner.outputs.tracking`)."""

from __future__ import annotations

from typing import Any

from tuner.inputs.errors import RecipeError

TRACKERS = ("mlflow", "tensorboard", "wandb")
"""The experiment trackers a search can log to (``track:``, ``--track``)."""


def parse_track(value: Any, where: str = "track") -> tuple[str, ...]:
    """``[mlflow, tensorboard]`` or ``mlflow,tensorboard`` -> the trackers, each once, checked."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise RecipeError(f"{where}: expected tracker names ({', '.join(TRACKERS)}), a list or comma-separated, "
                          f"got {value!r}")
    names = tuple(dict.fromkeys(i.strip().lower() for i in items if i.strip()))
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise RecipeError(f"{where}: unknown tracker {unknown[0]!r}; expected {', '.join(TRACKERS)}")
    return names
