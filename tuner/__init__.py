"""tuner: measure a PyTorch training step, find its bottleneck, search the knobs that fix it.

Public API::

    tuner.measure(recipe, **knobs) -> Measurement
    tuner.search(recipe, **overrides) -> SearchResult
    tuner.Probe                     # the harness, for loops the tuner does not own
    tuner.config(**defaults)        # a script's knobs: the trial's under the tuner, else the defaults
    tuner.load_recipe(path)         # a validated Recipe
"""

from tuner.api import Measurement, measure
from tuner.controller import SearchResult, search
from tuner.errors import RecipeError, TrialError
from tuner.probe import Probe
from tuner.recipe import Recipe, load_recipe
from tuner.script import TrialConfig, config

__all__ = ["Measurement", "Probe", "Recipe", "RecipeError", "SearchResult", "TrialConfig", "TrialError", "config",
           "load_recipe", "measure", "search"]
__version__ = "0.1.0"
