"""tuner: measure a PyTorch training step, find its bottleneck, search the knobs that fix it.

Public API::

    tuner.measure(recipe, **knobs) -> Measurement
    tuner.search(recipe, **overrides) -> SearchResult
    tuner.plan(recipe) -> CapacityPlan  # the largest micro-batch predicted to fit, per sharding x AMP x ckpt
    tuner.Probe                     # the harness, for loops the tuner does not own
    tuner.config(**defaults)        # a script's knobs: the trial's under the tuner, else the defaults
    tuner.load_recipe(path)         # a validated Recipe

The package is layered (README, "Inside"): ``config`` -> ``harness`` -> ``trial`` ->
(``scriptmode``, ``analysis``) -> ``tuning`` -> ``outputs`` -> ``api``/``cli`` -> the
command shims; a module imports only from its own layer or the ones before it.
"""

from tuner.api import CapacityPlan, Measurement, SearchResult, measure, plan, search
from tuner.config.errors import RecipeError, TrialError
from tuner.config.recipe import Recipe, load_recipe
from tuner.scriptmode.config import TrialConfig, config
from tuner.scriptmode.probe import Probe

__all__ = ["CapacityPlan", "Measurement", "Probe", "Recipe", "RecipeError", "SearchResult", "TrialConfig",
           "TrialError", "config", "load_recipe", "measure", "plan", "search"]
__version__ = "0.1.0"
