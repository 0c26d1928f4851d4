"""The search space on this machine: every knob's candidate values, the baseline as a point
of it, and how one point is asked of the sampler."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from tuner.inputs import layout, rules
from tuner.inputs.errors import RecipeError
from tuner.inputs.levers import LEVERS
from tuner.inputs.plan import Plan
from tuner.inputs.space import (
    RECORDED_DEFAULTS,
    Configs,
    Machine,
    defaults,
    restrict,
    unsupported,
)
from tuner.trial import layout_rules

if TYPE_CHECKING:
    from tuner.inputs.recipe import Recipe
    from tuner.study.study import Asked


@dataclass(frozen=True)
class Space:
    """What the search chooses from: every knob with its candidate values."""

    choices: dict[str, tuple[Any, ...]]
    notes: tuple[str, ...] = ()
    blocks: int | None = None
    """The model's blocks, where the layout's rules need them (pipeline stages)."""
    per_node: int | None = None
    """Ranks per node (a tensor-parallel group stays inside one)."""
    cuda: bool = True
    """The ranks are GPUs (some layouts are refused on CPU ranks only)."""
    machine: Machine | None = None
    """What this machine can do, for the rules (:mod:`tuner.inputs.rules`)."""
    make: Configs | None = None
    """How the recipe's configurations are made on this machine (:meth:`configs`, the search's)."""

    def refusal(self, config: Plan, global_batch: int) -> str | None:
        """Why this configuration cannot run (:mod:`tuner.inputs.rules`: its batch, its
        parallel layout, its kernels), or ``None``: it can."""
        machine = self.machine or Machine(cuda=self.cuda, bf16=True, fp16=self.cuda)
        return rules.refusal(config, rules.Where(machine, self.per_node, self.blocks, global_batch))

    def valid(self, params: Mapping[str, Any]) -> bool:
        """Whether a recorded configuration's layout is one the world and the global batch allow
        (a change toward the best may need its layout first: a micro-batch a larger
        data-parallel share cannot hold)."""
        make = self.make
        assert make is not None, "a space made by build_space"
        return self.refusal(make.of_params(params), make.global_batch_size) is None

    def holds(self, params: Mapping[str, Any], world_size: int) -> bool:
        """Whether ``params`` is a point of the space: each knob at one of its values, or
        meaning nothing there (loader knobs without workers, buckets without their engine)."""
        return all(params[k] in values or not rules.applies(k, params, world_size)
                   for k, values in self.choices.items() if k in params)

    def size(self) -> int:
        """How many points the space has at most (values that cannot go together and knobs
        that do not apply make it fewer; :meth:`configs` counts them exactly, slowly)."""
        return math.prod(len(v) for v in self.choices.values())

    def configs(self) -> list[Plan]:
        """Every distinct configuration (a knob that does not apply collapses to its default;
        values that cannot go together, FSDP2 with ZeRO, are no configuration)."""
        make = self.make
        assert make is not None, "a space made by build_space"
        keys = list(self.choices)
        out: dict[Plan, None] = {}
        for values in itertools.product(*(self.choices[k] for k in keys)):
            try:
                config = make(dict(zip(keys, values)), strict=False)
            except RecipeError:  # values that are no configuration (FSDP2 with ZeRO, ...)
                continue
            if self.refusal(config, make.global_batch_size) is None:  # nor a bad layout
                out[config] = None
        return list(out)


COUNTED_UP_TO = 4096
"""Spaces of at most this many points are counted exactly at the start (a few ms), so a
search that has measured every one stops at once as ``exhausted`` instead of asking the
sampler again (seen: a 12-point job wrote 111 trials.csv rows for 11 measured trials)."""


def every_key(space: Space) -> set[tuple] | None:
    """Every configuration of the space, by :func:`config_key` (``None``: too many to count)."""
    if space.size() > COUNTED_UP_TO:
        return None
    return {config_key(c) for c in space.configs()}


def build_space(recipe: "Recipe", machine: Machine) -> Space:
    """The recipe's space on this machine. A searched knob (a list) also holds the
    baseline's value, so the baseline is a point of the search; a fixed knob (a scalar)
    stays fixed; an omitted knob stays at the baseline's value; ``--set`` fixes a knob."""
    base = _baseline_values(recipe)
    choices: dict[str, tuple[Any, ...]] = {}
    for name in LEVERS:
        values = list(recipe.space.get(name, ()))
        if not values:
            values = [base[name]]
        elif len(values) > 1 and base[name] not in values:
            values.insert(0, base[name])
        choices[name] = tuple([recipe.knob_overrides[name]] if name in recipe.knob_overrides else values)
    restricted, notes = restrict(choices, machine, _adapt(recipe))
    per_node = layout.ranks_per_node(recipe.world_size)
    blocks = layout_rules.restrict(restricted, recipe.task, recipe.task_args, recipe.world_size, per_node,
                                   recipe.script is not None, notes)
    return Space(restricted, tuple(notes), blocks, per_node, machine.cuda, machine, recipe.configs(machine))


def _adapt(recipe: "Recipe") -> str | None:
    """Script mode's adapter, whose library may refuse what the machine could run."""
    return recipe.script.adapt if recipe.script is not None else None


def _baseline_values(recipe: "Recipe") -> dict[str, Any]:
    """Defaults <- the recipe's baseline <- ``--set``; no accumulation unless told."""
    knobs = {name: knob.default for name, knob in LEVERS.items()}
    knobs["micro_batch_size"] = recipe.global_batch_size // recipe.world_size
    knobs.update(recipe.baseline)
    knobs.update(recipe.knob_overrides)
    return knobs


def baseline_knobs(recipe: "Recipe", space: Space, machine: Machine) -> dict[str, Any]:
    """The user's current configuration, measured as it is even where the space fixes a
    knob to another value; only what this machine cannot run is replaced."""
    knobs = _baseline_values(recipe)
    for name, value, _why, fallback in unsupported(machine, _adapt(recipe)):
        if knobs[name] == value:
            knobs[name] = fallback
    return knobs


def suggest(trial: "Asked", space: Space, baseline: Mapping[str, Any], world_size: int = 1) -> dict[str, Any]:
    """Ask the sampler for one point, each knob only where it applies given those asked
    before it (:func:`tuner.inputs.rules.applies`: loader-only knobs with workers, FSDP2
    without ZeRO, offload with sharding, buckets with their engine). The enqueued baseline
    trial keeps the baseline's values for knobs the space fixes."""
    if trial.attrs.get("baseline"):
        space = Space({k: (baseline[k],) if len(v) == 1 else v for k, v in space.choices.items()})
    knobs = defaults()
    for name, values in space.choices.items():  # LEVERS order: a knob's conditions come before it
        if not rules.applies(name, knobs, world_size):
            knobs[name] = LEVERS[name].default
        elif len(values) > 1:
            knobs[name] = trial.choose(name, values)
        else:
            knobs[name] = values[0]
    return knobs


def config_key(config: Plan) -> tuple:
    """One configuration's key: its params, sorted (the world is the job's)."""
    return params_key(config.params())


def params_key(params: Mapping[str, Any]) -> tuple:
    """The :func:`config_key` of a trial's recorded params."""
    return tuple(sorted({**RECORDED_DEFAULTS, **params}.items()))
