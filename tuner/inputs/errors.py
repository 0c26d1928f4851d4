"""Errors the user can act on.

A :class:`RecipeError` means the input is wrong (recipe, task file, ``--set``): the
commands print its message and exit with status 2, never a traceback. A
:class:`TrialError` means one trial could not train; it becomes a recorded failure.
"""

from __future__ import annotations


class RecipeError(Exception):
    """Bad input, reported as ``<where>: <what is wrong>; <what is allowed>``."""

    exit_code = 2


class TrialError(Exception):
    """A trial failed for a reason that is not a bug in the tuner (e.g. an empty dataset)."""
