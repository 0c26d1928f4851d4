"""The knobs a trial can turn: what applies, and a trial's :class:`~tuner.inputs.plan.Plan`
made from them.

:func:`make_config` makes one point of the space complete and normalised: gradient
accumulation is derived from the global batch, loader-only knobs are neutral without
workers, and knobs this machine cannot honour have been replaced (with a note saying
why). Everything downstream (engines, trial, exports) takes the ``Plan``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

from tuner.inputs.engine import engine_clash, engine_of
from tuner.inputs.errors import RecipeError
from tuner.inputs.lever import Lever
from tuner.inputs.levers import LEVERS
from tuner.inputs.machine import Machine, native_bf16
from tuner.inputs.plan import DEFAULTS, Plan
from tuner.inputs.rules import applies, conflict

__all__ = ["Configs", "Machine",
           "defaults", "make_config", "native_bf16", "numerics", "parse_knobs", "parse_space",
           "reference_knobs", "restrict", "unsupported"]


def defaults() -> dict[str, Any]:
    """Every knob at its default (``micro_batch_size`` ``None``: no accumulation), a copy to change."""
    return dict(DEFAULTS)


GUARDED = tuple((name, lever.reference) for name, lever in LEVERS.items() if lever.guarded)
"""Knobs that change a step's arithmetic, with the value the precision guard's reference
runs at: reduced precision, TF32 and compiled kernels round differently; checkpointing and
sharding should be exact up to reduction order, which the guard then shows."""
PRECISION = "amp_dtype"
"""The guarded knob every label starts with."""


def numerics(config: Plan | Mapping[str, Any]) -> str | None:
    """How a configuration's arithmetic differs from the guard's reference ("bf16",
    "fp32 + compile", ...), or ``None`` when it is reference-like; ``config`` a plan or a
    trial's recorded params."""
    get = config.get if isinstance(config, Mapping) else functools.partial(getattr, config)
    changed = [name for name, ref in GUARDED if name != PRECISION and get(name, ref) != ref]
    if get(PRECISION, "fp32") == "fp32" and not changed:
        return None
    words = [str(get(PRECISION, "fp32"))]
    words += [name if LEVERS[name].kind is bool else f"{name}={get(name, None)}" for name in changed]
    return " + ".join(words)


def reference_knobs(params: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration the precision guard's reference curve comes from: the same, at
    every guarded lever's reference (fp32, eager, no checkpointing or FSDP2, full-precision
    matmuls), with what those leave meaningless (FSDP2's offload) and batches in order."""
    knobs = {k: v for k, v in params.items() if k in LEVERS}
    knobs.update({name: ref for name, ref in GUARDED})
    knobs["in_order"] = True
    if knobs.get("zero_stage", 0) == 0:
        knobs["offload_optimizer"] = "none"
    return knobs


RECORDED_DEFAULTS = {**{name: value for name, value in DEFAULTS.items() if value is not None}, "engine": "torch"}
"""What a trial's recorded params hold where a lever was added since: its default."""


def parse_space(raw: Any, where: str = "space") -> dict[str, tuple[Any, ...]]:
    """Validate the recipe's ``space``: a list is searched, a scalar is fixed."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise RecipeError(f"{where}: expected a mapping of knob: [values], got {type(raw).__name__}")
    out: dict[str, tuple[Any, ...]] = {}
    for name, value in raw.items():
        knob = _knob(name, f"{where}.{name}")
        if isinstance(value, (list, tuple)):
            if not value:
                raise RecipeError(f"{where}.{name}: empty list; give at least one value")
            values = tuple(knob.parse(v, f"{where}.{name}[{i}]") for i, v in enumerate(value))
            out[name] = tuple(dict.fromkeys(values))  # drop duplicates, keep order
        else:
            out[name] = (knob.parse(value, f"{where}.{name}"),)
    return out


def parse_knobs(raw: Any, where: str) -> dict[str, Any]:
    """Validate a mapping of fixed knob values (``baseline``, ``--set``)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise RecipeError(f"{where}: expected a mapping of knob: value, got {type(raw).__name__}")
    sep = " " if where.startswith("--") else "."  # "--set num_workers", "baseline.num_workers"
    return {name: _knob(name, f"{where}{sep}{name}").parse(v, f"{where}{sep}{name}") for name, v in raw.items()}


def _knob(name: str, where: str) -> Lever:
    if name not in LEVERS:
        import difflib

        close = difflib.get_close_matches(str(name), LEVERS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise RecipeError(f"{where}: unknown knob{hint}; knobs are {', '.join(LEVERS)}")
    return LEVERS[name]


def check_divisible(global_batch_size: int, micro_sizes: Sequence[int], world_size: int, where: str) -> None:
    """Refuse micro-batches that cannot make up the global batch on this many ranks."""
    for micro in micro_sizes:
        if global_batch_size % (micro * world_size):
            ok = [m for m in range(1, global_batch_size // world_size + 1)
                  if global_batch_size % (m * world_size) == 0]
            raise RecipeError(
                f"{where}: global_batch_size {global_batch_size} is not divisible by "
                f"micro_batch_size {micro} x world size {world_size}; "
                f"micro-batch sizes that work: {', '.join(map(str, ok)) or 'none'}"
            )


def restrict(space: Mapping[str, tuple[Any, ...]], machine: Machine,
             adapt: str | None = None) -> tuple[dict[str, tuple[Any, ...]], list[str]]:
    """Drop values this machine (or, under script mode's ``adapt``, its library here) cannot
    run, returning the space and one note per drop."""
    out = dict(space)
    notes: list[str] = []
    for name, value, reason, fallback in unsupported(machine, adapt):
        values = out.get(name)
        if values and value in values:
            kept = tuple(v for v in values if v != value) or (fallback,)
            out[name] = kept
            notes.append(f"{name}={written(value)} dropped: {reason}")
    return out, notes


def make_config(
    knobs: Mapping[str, Any],
    global_batch_size: int,
    world_size: int,
    machine: Machine,
    engine: str = "auto",
    strict: bool = True,
) -> tuple[Plan, list[str]]:
    """Complete and normalise one configuration; returns it and notes on what changed.
    ``strict=False`` (the search, whose sampler may pair a micro-batch with a layout it does
    not fit) leaves the batch's divisibility to :mod:`tuner.inputs.rules`."""
    values = defaults()
    values.update(knobs)
    notes: list[str] = []
    for name, value, reason, fallback in unsupported(machine):
        if values[name] == value:
            notes.append(f"{name}={written(value)} cannot apply here ({reason}); using {written(fallback)}")
            values[name] = fallback
    why = conflict(values)
    if why is not None:
        raise RecipeError(why)
    for name in LEVERS:  # a knob that means nothing here takes its default (one config, one key)
        if not applies(name, values, world_size):
            values[name] = LEVERS[name].default
    why = engine_clash({name: (value,) for name, value in values.items()}, engine)
    if why is not None:
        raise RecipeError(why)
    try:
        plan = Plan.batched(world_size, global_batch_size, engine_of(values, engine), **values)
    except ValueError as exc:  # a value its knob does not take (a hand-edited best.json, say)
        raise RecipeError(str(exc)) from None
    if strict:  # the batch is counted over the model copies
        check_divisible(global_batch_size, [plan.batch.micro_batch_size], plan.layout.dp, "micro_batch_size")
    return plan, notes


@dataclasses.dataclass(frozen=True)
class Configs:
    """How every configuration of one job on one machine is made: the recipe's global batch,
    world size and engine, and the machine, bound once (:meth:`tuner.inputs.recipe.Recipe.configs`),
    so a caller names only the knobs. Nine call sites over five packages each passed the same
    four values to :func:`make_config`."""

    global_batch_size: int
    world_size: int
    machine: Machine
    engine: str = "auto"

    def make(self, knobs: Mapping[str, Any], strict: bool = True) -> tuple[Plan, list[str]]:
        """:func:`make_config` of ``knobs``: the configuration, and notes on what changed."""
        return make_config(knobs, self.global_batch_size, self.world_size, self.machine, self.engine, strict)

    def __call__(self, knobs: Mapping[str, Any], strict: bool = True) -> Plan:
        return self.make(knobs, strict)[0]

    def of_params(self, params: Mapping[str, Any]) -> Plan:
        """The configuration of a trial's recorded params (what is derived, the accumulation and
        the engine, derived again; the sampler may pair a micro-batch with a layout it does not
        fit, which the layout's refusal says, so the batch's divisibility is not checked)."""
        return self({k: v for k, v in params.items() if k in LEVERS}, strict=False)

    def normalised(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The recorded params of the configuration ``params`` make (:meth:`of_params`): the
        form the pool, the finish and the attribution compare configurations in."""
        return self.of_params(params).params()


def unsupported(machine: Machine, adapt: str | None = None) -> list[tuple[str, Any, str, Any]]:
    """(knob, value, why it cannot run here, what to use instead); ``adapt``: script mode's
    adapter, whose library may refuse more."""
    out = [(name, value, why, fallback) for name, lever in LEVERS.items()
           for value, why, fallback in lever.refused(machine)]
    if adapt is not None:
        out += [(name, value, why, fallback) for name, lever in LEVERS.items() if adapt in lever.script.refused_under
                for value, why, fallback in lever.script.refused_under[adapt](machine)]
    return out


def written(value: Any) -> str:
    """A knob's value as a recipe writes it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
