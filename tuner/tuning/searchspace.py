"""The search space on this machine: every knob's candidate values, the baseline as a point
of it, and how one point is asked of the sampler."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from tuner.config.space import KNOBS, Config, Machine, make_config, restrict, unsupported

if TYPE_CHECKING:
    import optuna

    from tuner.config.recipe import Recipe

LOADER_ONLY = ("prefetch_factor", "persistent_workers")
"""Knobs that only exist when ``num_workers > 0``: suggested conditionally."""


@dataclass(frozen=True)
class Space:
    """What the search chooses from: every knob with its candidate values."""

    choices: dict[str, tuple[Any, ...]]
    notes: tuple[str, ...] = ()

    def configs(self, global_batch_size: int, world_size: int, machine: Machine, engine: str) -> list[Config]:
        """Every distinct configuration (loader-only knobs collapse without workers)."""
        keys = list(self.choices)
        out: list[Config] = []
        for values in itertools.product(*(self.choices[k] for k in keys)):
            config, _ = make_config(dict(zip(keys, values)), global_batch_size, world_size, machine, engine)
            if config not in out:
                out.append(config)
        return out


def build_space(recipe: "Recipe", machine: Machine) -> Space:
    """The recipe's space on this machine. A searched knob (a list) also holds the
    baseline's value, so the baseline is a point of the search; a fixed knob (a scalar)
    stays fixed; an omitted knob stays at the baseline's value; ``--set`` fixes a knob."""
    base = _baseline_values(recipe)
    choices: dict[str, tuple[Any, ...]] = {}
    for name in KNOBS:
        values = list(recipe.space.get(name, ()))
        if not values:
            values = [base[name]]
        elif len(values) > 1 and base[name] not in values:
            values.insert(0, base[name])
        choices[name] = tuple([recipe.knob_overrides[name]] if name in recipe.knob_overrides else values)
    restricted, notes = restrict(choices, machine)
    return Space(restricted, tuple(notes))


def _baseline_values(recipe: "Recipe") -> dict[str, Any]:
    """Defaults <- the recipe's baseline <- ``--set``; no accumulation unless told."""
    knobs = {name: knob.default for name, knob in KNOBS.items()}
    knobs["micro_batch_size"] = recipe.global_batch_size // recipe.world_size
    knobs.update(recipe.baseline)
    knobs.update(recipe.knob_overrides)
    return knobs


def baseline_knobs(recipe: "Recipe", space: Space, machine: Machine) -> dict[str, Any]:
    """The user's current configuration, measured as it is even where the space fixes a
    knob to another value; only what this machine cannot run is replaced."""
    knobs = _baseline_values(recipe)
    for name, value, _why, fallback in unsupported(machine):
        if knobs[name] == value:
            knobs[name] = fallback
    return knobs


def suggest(trial: "optuna.Trial", space: Space, baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Ask the sampler for one point; loader-only knobs only when there are workers. The
    enqueued baseline trial keeps the baseline's values for knobs the space fixes."""
    if trial.user_attrs.get("baseline"):
        space = Space({k: (baseline[k],) if len(v) == 1 else v for k, v in space.choices.items()})
    knobs: dict[str, Any] = {}
    for name, values in space.choices.items():
        if name in LOADER_ONLY:
            continue
        knobs[name] = trial.suggest_categorical(name, list(values)) if len(values) > 1 else values[0]
    for name in LOADER_ONLY:
        values = space.choices[name]
        if knobs["num_workers"] > 0 and len(values) > 1:
            knobs[name] = trial.suggest_categorical(name, list(values))
        else:
            knobs[name] = values[0] if knobs["num_workers"] > 0 else KNOBS[name].default
    return knobs


def config_key(config: Config) -> tuple:
    return tuple(sorted(config.params().items()))
