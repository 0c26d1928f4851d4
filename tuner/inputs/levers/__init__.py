"""The levers, one declaration each (:class:`~tuner.inputs.lever.Lever`), in one module per
family: :mod:`.loader`, :mod:`.precision`, :mod:`.batch`, :mod:`.parallel`,
:mod:`.sharding`, :mod:`.checkpointing`, :mod:`.kernels`, :mod:`.process`. A family module
holds its levers' entries and the functions they name in the config layer (refusals,
conflicts, exports); the trial layer's apply functions are named by ``module:function`` and
resolved there. Where each lever stands among the others (the configuration's fields, the
attribution's path, the guided walk, each verdict's levers) is :mod:`.orders`.

Adding a lever is its family's entry, its place in :mod:`.orders`, and its apply function;
``tests/structure/test_registry.py`` fails when an entry lacks what a layer needs.
"""

from __future__ import annotations

from typing import Any, Mapping

from tuner.inputs.lever import Lever
from tuner.inputs.levers import batch, checkpointing, kernels, loader, orders, parallel, precision, process, sharding

FAMILIES = (loader, precision, batch, parallel, sharding, checkpointing, kernels, process)
"""The family modules, each with its ``DECLARED`` levers."""
_DECLARED: dict[str, Lever] = {lever.name: lever for family in FAMILIES for lever in family.DECLARED}
LEVERS: dict[str, Lever] = {name: _DECLARED[name] for name in orders.FIELDS}
"""Every lever, in the order of a configuration's fields (:data:`.orders.FIELDS`)."""
if set(LEVERS) != set(_DECLARED):
    raise ImportError(f"levers declared but not in orders.FIELDS: {sorted(set(_DECLARED) - set(LEVERS))}")


ENGINE_ORDER = ("layout", "fsdp", "deepspeed")
"""Which engine label a configuration takes where its levers give several (a layout shards
its data-parallel dimension with FSDP2 inside the layout)."""
ENGINE_NAMES = {"torch": "PyTorch's engine", "deepspeed": "DeepSpeed"}
"""The recipe's ``engine`` values, in words."""


def engine_of(values: Mapping[str, Any], asked: str = "auto") -> str:
    """The engine label of these knob values (every lever's, after the levers that mean
    nothing took their defaults); ``asked``: the recipe's ``engine``."""
    moved = {lever.engine for name, lever in LEVERS.items()
             if lever.engine and values.get(name, lever.default) != lever.default}
    return next((e for e in ENGINE_ORDER if e in moved), "deepspeed" if asked == "deepspeed" else "torch")


def engine_clash(values: Mapping[str, tuple[Any, ...]], asked: str) -> str | None:
    """Why lever values (each lever's possible values) cannot run on the engine the recipe
    names (``None``: they can, or the recipe says ``auto``)."""
    if asked == "auto":
        return None
    for name, lever in LEVERS.items():
        others = [v for v in values.get(name, ()) if v != lever.default]
        if lever.runs_on and lever.runs_on != asked and others:
            return (f"engine: {asked} cannot run {name} {', '.join(map(str, others))}, which "
                    f"{ENGINE_NAMES[lever.runs_on]} runs; use engine: auto, or {name}: {lever.default}")
    return None


def recomputing() -> tuple[str, ...]:
    """The levers that trade recompute for activation memory (``Lever.memory.frees_activations``)."""
    return tuple(name for name, lever in LEVERS.items() if lever.memory.frees_activations)


def sharded_engines() -> frozenset[str]:
    """The engine labels of the sharding levers (their collectives overlap the step)."""
    return frozenset(lever.engine for lever in LEVERS.values() if lever.group == "sharding" and lever.engine)


def loader_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    """The DataLoader keywords of the loader levers in ``values`` (every loader lever, by
    name): each that means something given the others (``prefetch_factor`` only with
    workers, which the DataLoader enforces), one only recent DataLoaders take only away
    from its default."""
    return {lever.applied.loader_kwarg: values[name] for name, lever in LEVERS.items()
            if lever.group == "loader" and lever.applied.loader_kwarg and lever.needs(values, 1)
            and (lever.applied.kwarg_at_default or values[name] != lever.default)}


def of(group: str) -> tuple[str, ...]:
    """The levers of one group, in declaration order."""
    return tuple(name for name, lever in LEVERS.items() if lever.group == group)


def by(order: str) -> tuple[str, ...]:
    """The levers in one of the registry's orders (``path``, ``walk``: :mod:`.orders`)."""
    return {"path": orders.PATH, "walk": orders.WALK}[order]


def proven(step: str) -> bool:
    """Whether an attribution step (``zero_stage``, ``zero_stage+fsdp``) holds a lever that
    stays in an answer only on evidence of a gain (:attr:`Lever.proven`)."""
    return any(LEVERS[k].proven for k in step.split("+") if k in LEVERS)


def with_memory(effect: str) -> tuple[str, ...]:
    return tuple(name for name, lever in LEVERS.items() if lever.memory.effect == effect)


def pointed_at(verdict: str) -> tuple[str, ...]:
    """The levers a verdict points at, its first choice first."""
    return orders.VERDICTS.get(verdict, ())


def verdict_kinds() -> tuple[str, ...]:
    return tuple(orders.VERDICTS)
