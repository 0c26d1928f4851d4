"""The engines a configuration runs on, named in this one table (:data:`ENGINES`).

A configuration's ``engine`` is the label trials.csv writes: ``torch`` (one process or DDP),
``layout`` (tensor / pipeline parallelism), ``fsdp`` (FSDP2), all run by PyTorch's engine,
and ``deepspeed``. Every other module asks an engine's facts (:func:`kind`), never its name:
a new engine is a row here and its trial module (docs/architecture.md). A lever moving a
configuration to an engine names it in its declaration (``Lever.engine``, ``Lever.runs_on``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from tuner.inputs.levers import LEVERS

Library = Literal["torch", "deepspeed"]
"""The recipe's ``engine`` other than ``auto``: the library that runs a configuration's steps."""
LIBRARIES: dict[str, str] = {"torch": "PyTorch's engine", "deepspeed": "DeepSpeed"}
"""Each library, in words."""
EngineName = Literal["auto", Library]
"""The recipe's ``engine``: ``auto`` runs each configuration on the library its levers ask
for (zero_stage 0 as DDP, stages 1-3 as DeepSpeed)."""


@dataclass(frozen=True)
class EngineKind:
    """What the layers ask of one engine (its name is its key in :data:`ENGINES`)."""

    library: Library
    wraps_model: bool = False
    """Its library's engine wraps the model: it holds the precision (no outer autocast; the
    inputs are cast), places the model on the device, and trains with ``ds_config.json``,
    which the configs to paste point at."""
    ddp: bool = False
    """Its data-parallel copies are DDP replicas (``ddp_bucket_cap_mb`` applies)."""
    sharded: bool = False
    """It shards the model states: its collectives overlap the step, and a failed trial on
    several ranks can leave them queued on the others."""
    split: bool = False
    """Its model is cut over ranks (tensor / pipeline): a trial's FLOP count is not the model's."""


ENGINES: dict[str, EngineKind] = {
    "torch": EngineKind("torch", ddp=True),
    "layout": EngineKind("torch", split=True),
    "fsdp": EngineKind("torch", sharded=True),
    "deepspeed": EngineKind("deepspeed", wraps_model=True, sharded=True),
}
"""Each library's plain engine is the one of its own name (``torch``: one process or DDP)."""
ORDER = ("layout", "fsdp", "deepspeed")
"""Which engine a configuration takes where its levers give several (a layout shards its
data-parallel dimension with FSDP2 inside the layout)."""


def kind(name: str | None) -> EngineKind:
    """The facts of an engine label (a run recorded without one ran PyTorch's)."""
    return ENGINES[name or "torch"]


def engine_of(values: Mapping[str, Any], asked: str = "auto") -> str:
    """The engine label of these knob values (every lever's, after the levers that mean
    nothing took their defaults); ``asked``: the recipe's ``engine``."""
    moved = {lever.engine for name, lever in LEVERS.items()
             if lever.engine and values.get(name, lever.default) != lever.default}
    return next((e for e in ORDER if e in moved), asked if asked in LIBRARIES else "torch")


def engine_clash(values: Mapping[str, tuple[Any, ...]], asked: str) -> str | None:
    """Why lever values (each lever's possible values) cannot run on the engine the recipe
    names (``None``: they can, or the recipe says ``auto``)."""
    if asked not in LIBRARIES:
        return None
    for name, lever in LEVERS.items():
        others = [v for v in values.get(name, ()) if v != lever.default]
        if lever.runs_on and lever.runs_on != asked and others:
            return (f"engine: {asked} cannot run {name} {', '.join(map(str, others))}, which "
                    f"{LIBRARIES[lever.runs_on]} runs; use engine: auto, or {name}: {lever.default}")
    return None


def wrapping(asked: str) -> bool:
    """Whether the recipe's ``engine`` asks for a library whose engine wraps the model."""
    return asked in LIBRARIES and ENGINES[asked].wraps_model
