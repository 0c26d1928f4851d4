"""tuner: measure a PyTorch training step, find its bottleneck, search the knobs that fix it.

Public API::

    tuner.measure(recipe, **knobs) -> Measurement
    tuner.search(recipe, **overrides) -> SearchResult
    tuner.compare(run_a, run_b, a="best", b="best") -> Comparison  # two run folders side by side
    tuner.plan(recipe) -> CapacityPlan  # the largest micro-batch predicted to fit, per sharding x AMP x ckpt
    tuner.Probe                     # the harness, for loops the tuner does not own
    tuner.diagnose(probe, **knobs)  # its window's verdicts: the bottleneck and what to try next
    tuner.config(**defaults)        # a script's knobs: the trial's under the tuner, else the defaults
    tuner.load_recipe(path)         # a validated Recipe

The package is layered (docs/architecture.md): ``inputs`` -> ``harness`` -> ``trial`` ->
(``scriptmode``, ``analysis``) -> ``tuning`` -> ``outputs`` -> ``api``/``cli`` -> the
command shims; a module imports only from its own layer or the ones before it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tuner.inputs.errors import RecipeError, TrialError
from tuner.inputs.recipe import Recipe, load_recipe
from tuner.scriptmode.config import TrialConfig
from tuner.scriptmode.config import config as _script_config


def config(global_batch_size: int | None = None, **defaults: Any) -> TrialConfig:
    """A script's knobs: the trial's under the tuner, else ``defaults``
    (:func:`tuner.scriptmode.config.config`). A plain function: the package of the user's
    input is :mod:`tuner.inputs` (it was ``tuner.config``, made callable by swapping its
    module class so the two could share the name)."""
    return _script_config(global_batch_size, **defaults)


if TYPE_CHECKING:
    from tuner.api import CapacityPlan, Measurement, SearchResult, diagnose, measure, plan, search
    from tuner.outputs.comparison import compare
    from tuner.scriptmode.probe import Probe

_LAZY = {"CapacityPlan": "tuner.api", "Measurement": "tuner.api", "SearchResult": "tuner.api", "diagnose": "tuner.api",
         "measure": "tuner.api", "plan": "tuner.api", "search": "tuner.api", "Probe": "tuner.scriptmode.probe",
         "compare": "tuner.outputs.comparison"}
"""Imported on first use. A script's ``import tuner`` (and each script-mode trial's adapter)
then pays for the trial file and its knobs, not for the search (Optuna, SQLAlchemy, the
engines): 0.26 -> 0.17 s after ``import torch`` on this machine (``python -X importtime``),
once per rank per trial."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        try:  # a subpackage named as an attribute (tuner.api.search) before anything imported it
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


__all__ = ["CapacityPlan", "Measurement", "Probe", "compare", "Recipe", "RecipeError", "SearchResult", "TrialConfig",
           "TrialError", "config", "diagnose", "load_recipe", "measure", "plan", "search"]
__version__ = "0.1.0"
