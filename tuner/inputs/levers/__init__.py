"""The levers, one declaration each (:class:`~tuner.inputs.lever.Lever`), in one module per
family: :mod:`.loader`, :mod:`.precision`, :mod:`.batch`, :mod:`.parallel`,
:mod:`.sharding`, :mod:`.checkpointing`, :mod:`.kernels`, :mod:`.process`. A family module
holds its levers' entries and the functions they name in the config layer (what a machine
refuses, a process lever's setter); the rules between knobs are :mod:`tuner.inputs.rules`;
the trial layer applies each lever where its stage runs
(:mod:`tuner.trial.engines.stages`, written out in order). Where each lever stands among
the others (the configuration's fields, the attribution's path, the guided walk, each
verdict's levers) is :mod:`.orders`.

Adding a lever is its field in :mod:`tuner.inputs.plan` (its kind, default and values), its
family's entry, its place in :mod:`.orders`, its rules (if any) in :mod:`tuner.inputs.rules`,
and its apply function called where its stage runs;
``tests/structure/test_registry.py`` fails when an entry lacks what a layer needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tuner.inputs.lever import Lever
from tuner.inputs.levers import batch, checkpointing, kernels, loader, orders, parallel, precision, process, sharding
from tuner.inputs.plan import ORDER, Plan
from tuner.inputs.rules import applies

FAMILIES = (loader, precision, batch, parallel, sharding, checkpointing, kernels, process)
"""The family modules, each with its ``DECLARED`` levers."""
_DECLARED: dict[str, Lever] = {lever.name: lever for family in FAMILIES for lever in family.DECLARED}
LEVERS: dict[str, Lever] = {name: _DECLARED[name] for name in ORDER}
"""Every lever, in the order of a configuration's fields (:data:`tuner.inputs.plan.ORDER`)."""
if set(LEVERS) != set(_DECLARED):
    raise ImportError(f"levers declared but not in plan.ORDER: {sorted(set(_DECLARED) - set(LEVERS))}")


def recomputing() -> tuple[str, ...]:
    """The levers that trade recompute for activation memory (``Lever.memory.frees_activations``)."""
    return tuple(name for name, lever in LEVERS.items() if lever.memory.frees_activations)


def dataloader_kwargs(config: Plan) -> dict[str, Any]:
    """Keyword arguments for ``torch.utils.data.DataLoader`` (without dataset/sampler): the
    micro-batch and every loader lever that means something here (``prefetch_factor`` only
    with workers, which the DataLoader enforces)."""
    return {"batch_size": config.batch.micro_batch_size, **loader_kwargs(dataclasses.asdict(config.loader))}


def loader_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    """The DataLoader keywords of the loader levers in ``values`` (every loader lever, by
    name): each that means something given the others (``prefetch_factor`` only with
    workers, which the DataLoader enforces), one only recent DataLoaders take only away
    from its default."""
    return {lever.applied.loader_kwarg: values[name] for name, lever in LEVERS.items()
            if lever.group == "loader" and lever.applied.loader_kwarg and applies(name, values, 1)
            and (lever.applied.kwarg_at_default or values[name] != lever.default)}


def of(group: str) -> tuple[str, ...]:
    """The levers of one group, in declaration order."""
    return tuple(name for name, lever in LEVERS.items() if lever.group == group)


def by(order: str) -> tuple[str, ...]:
    """The levers in one of the registry's orders (``path``, ``walk``: :mod:`.orders`)."""
    return {"path": orders.PATH, "walk": orders.WALK}[order]


def proven(step: str) -> bool:
    """Whether an attribution step (``zero_stage``, ``zero_stage+offload_optimizer``) holds a lever that
    stays in an answer only on evidence of a gain (:attr:`Lever.proven`)."""
    return any(LEVERS[k].proven for k in step.split("+") if k in LEVERS)


def with_memory(effect: str) -> tuple[str, ...]:
    return tuple(name for name, lever in LEVERS.items() if lever.memory.effect == effect)


def pointed_at(verdict: str) -> tuple[str, ...]:
    """The levers a verdict points at, its first choice first."""
    return orders.VERDICTS.get(verdict, ())


def verdict_kinds() -> tuple[str, ...]:
    return tuple(orders.VERDICTS)
