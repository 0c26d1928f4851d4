"""The knobs a trial can turn: their types, defaults, derived values and what applies here.

A :class:`Config` is one point of the space, complete and normalised: gradient
accumulation is derived from the global batch, loader-only knobs are neutral without
workers, and knobs this machine cannot honour have been replaced (with a note saying
why). Everything downstream (engines, trial, exports) takes a ``Config``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence, get_args

from tuner.config.errors import RecipeError

AmpDtype = Literal["fp32", "bf16", "fp16"]
"""The autocast dtypes a trial can run in (fp32: no autocast)."""
EngineName = Literal["auto", "torch", "deepspeed"]
"""The recipe's ``engine``: ``auto`` runs zero_stage 0 as DDP and stages 1-3 as DeepSpeed."""
AMP_DTYPES: tuple[str, ...] = get_args(AmpDtype)
ENGINES: tuple[str, ...] = get_args(EngineName)


@dataclass(frozen=True)
class Knob:
    """One tunable setting and the values it accepts."""

    name: str
    kind: type
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None

    def parse(self, value: Any, where: str) -> Any:
        """Check one value; ``where`` names it in the error (e.g. ``space.num_workers[2]``)."""
        if self.kind is bool:
            if not isinstance(value, bool):
                raise RecipeError(f"{where}: expected true or false, got {value!r}")
            return value
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise RecipeError(f"{where}: expected an integer, got {value!r}")
            if self.minimum is not None and value < self.minimum:
                raise RecipeError(f"{where}: must be >= {self.minimum}, got {value}")
            if self.maximum is not None and value > self.maximum:
                raise RecipeError(
                    f"{where}: must be between {self.minimum} and {self.maximum}, got {value}"
                )
            return value
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(map(str, self.choices))
            raise RecipeError(f"{where}: expected one of {allowed}, got {value!r}")
        return value


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("num_workers", int, 0, "DataLoader worker processes per rank", minimum=0),
        Knob("prefetch_factor", int, 2, "batches each worker loads ahead", minimum=1),
        Knob("pin_memory", bool, False, "page-locked host batches (CUDA only)"),
        Knob("persistent_workers", bool, False, "keep workers alive between epochs"),
        Knob("amp_dtype", str, "fp32", "autocast dtype", choices=AMP_DTYPES),
        Knob("micro_batch_size", int, None, "samples per rank per forward", minimum=1),
        Knob("zero_stage", int, 0, "DeepSpeed ZeRO stage; 0 = plain data parallel", minimum=0, maximum=3),
    )
}


@dataclass(frozen=True)
class Machine:
    """What this machine can do, as far as the knobs care."""

    cuda: bool
    bf16: bool
    fp16: bool

    @classmethod
    def detect(cls) -> "Machine":
        import torch

        cuda = torch.cuda.is_available()
        # bf16 autocast runs on every CPU torch supports; on CUDA it needs Ampere or newer.
        bf16 = torch.cuda.is_bf16_supported() if cuda else True
        return cls(cuda=cuda, bf16=bf16, fp16=cuda)


@dataclass(frozen=True)
class Config:
    """One complete configuration of a trial."""

    micro_batch_size: int
    grad_accum_steps: int
    num_workers: int = 0
    prefetch_factor: int = 2
    pin_memory: bool = False
    persistent_workers: bool = False
    amp_dtype: AmpDtype = "fp32"
    zero_stage: int = 0
    engine: Literal["torch", "deepspeed"] = "torch"
    """``torch`` (plain or DDP) or ``deepspeed``; derived from ``zero_stage`` and the recipe."""

    def params(self) -> dict[str, Any]:
        """The knobs, as recorded in results (derived values included)."""
        return dataclasses.asdict(self)

    def dataloader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader`` (without dataset/sampler)."""
        kwargs: dict[str, Any] = {
            "batch_size": self.micro_batch_size,
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
        }
        if self.num_workers > 0:  # DataLoader refuses these without workers
            kwargs["prefetch_factor"] = self.prefetch_factor
            kwargs["persistent_workers"] = self.persistent_workers
        return kwargs


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


def _knob(name: str, where: str) -> Knob:
    if name not in KNOBS:
        import difflib

        close = difflib.get_close_matches(str(name), KNOBS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise RecipeError(f"{where}: unknown knob{hint}; knobs are {', '.join(KNOBS)}")
    return KNOBS[name]


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


def default_micro_batch(global_batch_size: int, world_size: int) -> int:
    """No accumulation: each rank takes its whole share in one micro-batch."""
    return global_batch_size // world_size


def restrict(space: Mapping[str, tuple[Any, ...]], machine: Machine) -> tuple[dict[str, tuple[Any, ...]], list[str]]:
    """Drop values this machine cannot run, returning the space and one note per drop."""
    out = dict(space)
    notes: list[str] = []
    for name, value, reason, fallback in unsupported(machine):
        values = out.get(name)
        if values and value in values:
            kept = tuple(v for v in values if v != value) or (fallback,)
            out[name] = kept
            notes.append(f"{name}={_fmt(value)} dropped: {reason}")
    return out, notes


def make_config(
    knobs: Mapping[str, Any],
    global_batch_size: int,
    world_size: int,
    machine: Machine,
    engine: str = "auto",
) -> tuple[Config, list[str]]:
    """Complete and normalise one configuration; returns it and notes on what changed."""
    values = {name: knob.default for name, knob in KNOBS.items()}
    values.update(knobs)
    if values["micro_batch_size"] is None:
        values["micro_batch_size"] = default_micro_batch(global_batch_size, world_size)
    notes: list[str] = []
    for name, value, reason, fallback in unsupported(machine):
        if values[name] == value:
            notes.append(f"{name}={_fmt(value)} cannot apply here ({reason}); using {_fmt(fallback)}")
            values[name] = fallback
    check_divisible(global_batch_size, [values["micro_batch_size"]], world_size, "micro_batch_size")
    if values["num_workers"] == 0:  # loader-only knobs mean nothing without workers
        values["prefetch_factor"] = KNOBS["prefetch_factor"].default
        values["persistent_workers"] = False
    if engine == "torch" and values["zero_stage"] > 0:
        raise RecipeError(
            f"zero_stage: {values['zero_stage']} needs DeepSpeed, but the recipe says engine: torch; "
            "use engine: auto or deepspeed, or zero_stage: 0"
        )
    resolved_engine = "deepspeed" if engine == "deepspeed" or values["zero_stage"] > 0 else "torch"
    accum = global_batch_size // (values["micro_batch_size"] * world_size)
    return Config(grad_accum_steps=accum, engine=resolved_engine, **values), notes


def unsupported(machine: Machine) -> list[tuple[str, Any, str, Any]]:
    """(knob, value, why it cannot run here, what to use instead)."""
    rows = []
    if not machine.cuda:
        rows.append(("pin_memory", True, "no CUDA device; pinned memory only speeds host-to-GPU copies", False))
    if not machine.fp16:
        why = "fp16 autocast and loss scaling need a CUDA device" if not machine.cuda else "this GPU lacks fp16"
        rows.append(("amp_dtype", "fp16", why, "fp32"))
    if not machine.bf16:
        rows.append(("amp_dtype", "bf16", "this GPU does not support bf16 (needs compute capability 8.0+)", "fp32"))
    return rows


def _fmt(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
