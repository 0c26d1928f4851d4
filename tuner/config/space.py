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
FsdpMode = Literal["off", "full_shard", "shard_grad_op"]
"""FSDP2 ``fully_shard``: ``full_shard`` reshards parameters after the forward (ZeRO-3-like),
``shard_grad_op`` keeps them gathered until the backward (ZeRO-2-like)."""
CheckpointMode = Literal["none", "selective", "full"]
"""Activation checkpointing of the repeated blocks: every block, or every other one."""
OffloadMode = Literal["none", "cpu"]
OptimizerImpl = Literal["default", "foreach", "fused"]
"""torch.optim's implementations: the optimizer's own choice, multi-tensor, fused kernels."""
AMP_DTYPES: tuple[str, ...] = get_args(AmpDtype)
ENGINES: tuple[str, ...] = get_args(EngineName)
DEEPSPEED_BUCKET = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` / ``allgather_bucket_size`` (elements)."""


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
    aliases: tuple[tuple[Any, Any], ...] = ()
    """Values read as another: YAML 1.1 reads a bare ``off`` as false (``fsdp: [off, ...]``)."""

    def parse(self, value: Any, where: str) -> Any:
        """Check one value; ``where`` names it in the error (e.g. ``space.num_workers[2]``)."""
        for alias, meant in self.aliases:
            if value is alias or (type(value) is type(alias) and value == alias):
                value = meant
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
        Knob("fsdp", str, "off", "FSDP2 fully_shard per block and on the root", choices=get_args(FsdpMode),
             aliases=((False, "off"),)),
        Knob("activation_checkpointing", str, "none", "recompute block activations in the backward",
             choices=get_args(CheckpointMode), aliases=((False, "none"), (None, "none"))),
        Knob("compile", bool, False, "torch.compile of each block (or the model)"),
        Knob("ddp_bucket_cap_mb", int, 25, "DDP gradient bucket size, MiB (DDP only)", minimum=1),
        Knob("overlap_comm", bool, False, "DeepSpeed: overlap gradient reduction with the backward (ZeRO >= 1)"),
        Knob("reduce_bucket_size", int, DEEPSPEED_BUCKET, "DeepSpeed: elements reduced at once (ZeRO >= 1)",
             minimum=1),
        Knob("allgather_bucket_size", int, DEEPSPEED_BUCKET, "DeepSpeed: elements all-gathered at once (ZeRO 1-2)",
             minimum=1),
        Knob("offload_optimizer", str, "none", "optimizer states (and step) on the host (ZeRO >= 1 or FSDP2)",
             choices=get_args(OffloadMode), aliases=((False, "none"), (None, "none"))),
        Knob("optimizer_impl", str, "default", "torch.optim implementation", choices=get_args(OptimizerImpl)),
    )
}


def applies(name: str, knobs: Mapping[str, Any], world_size: int) -> bool:
    """Whether a knob means anything given the others (``knobs`` holds every knob).

    One table for two uses: :func:`make_config` resets a knob that means nothing to its
    default (so two configurations that train the same way are one), and the search only
    asks the sampler for a knob where it applies.
    """
    zero, fsdp = knobs["zero_stage"], knobs["fsdp"]
    if name in ("prefetch_factor", "persistent_workers"):
        return knobs["num_workers"] > 0
    if name == "ddp_bucket_cap_mb":  # DDP exists only on several ranks, without sharding
        return world_size > 1 and zero == 0 and fsdp == "off"
    if name in ("overlap_comm", "reduce_bucket_size"):
        return zero >= 1
    if name == "allgather_bucket_size":  # ZeRO-3 gathers with stage3_prefetch_bucket_size instead
        return zero in (1, 2)
    if name == "offload_optimizer":
        return zero >= 1 or fsdp != "off"
    if name == "fsdp":
        return zero == 0
    return True


def defaults() -> dict[str, Any]:
    """Every knob at its default (``micro_batch_size`` ``None``: no accumulation)."""
    return {name: knob.default for name, knob in KNOBS.items()}


GUARDED = (("amp_dtype", "fp32"), ("compile", False), ("activation_checkpointing", "none"), ("fsdp", "off"))
"""Knobs that change a step's arithmetic, with the value the precision guard's reference
runs at: reduced precision and compiled kernels round differently; checkpointing and
sharding should be exact up to reduction order, which the guard then shows."""


def numerics(params: Mapping[str, Any]) -> str | None:
    """How a configuration's arithmetic differs from the guard's reference ("bf16",
    "fp32 + compile", ...), or ``None`` when it is reference-like."""
    changed = [name for name, ref in GUARDED[1:] if params.get(name, ref) != ref]
    if params.get("amp_dtype", "fp32") == "fp32" and not changed:
        return None
    words = [str(params.get("amp_dtype", "fp32"))]
    words += [name if name == "compile" else f"{name}={params[name]}" for name in changed]
    return " + ".join(words)


def reference_knobs(params: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration the precision guard's reference curve comes from: the same, in
    fp32, eager, without checkpointing or FSDP2 (and so without FSDP2's offload)."""
    knobs = {k: v for k, v in params.items() if k in KNOBS}
    knobs.update({name: ref for name, ref in GUARDED})
    if knobs.get("zero_stage", 0) == 0:
        knobs["offload_optimizer"] = "none"
    return knobs


def conflict(knobs: Mapping[str, Any]) -> str | None:
    """Why a set of knob values is not a configuration at all (``None`` if it is one)."""
    knobs = {**defaults(), **knobs}
    if knobs["fsdp"] != "off" and knobs["zero_stage"] > 0:
        return (f"fsdp: {knobs['fsdp']} and zero_stage: {knobs['zero_stage']} are two ways to shard the same "
                "model; choose one (fsdp: off, or zero_stage: 0)")
    if knobs["offload_optimizer"] != "none" and knobs["zero_stage"] == 0 and knobs["fsdp"] == "off":
        return ("offload_optimizer: cpu needs a sharded optimizer to offload; use it with zero_stage >= 1 "
                "or fsdp: full_shard / shard_grad_op")
    return None


@dataclass(frozen=True)
class Machine:
    """What this machine can do, as far as the knobs care."""

    cuda: bool
    bf16: bool
    fp16: bool
    compiler: bool = True
    """A C++ compiler for inductor's CPU code (a GPU build still compiles host code)."""
    fsdp2: bool = True

    @classmethod
    def detect(cls) -> "Machine":
        import shutil

        import torch

        cuda = torch.cuda.is_available()
        # bf16 autocast runs on every CPU torch supports; on CUDA only where the device runs it
        # natively (Ampere or newer): by default torch also says yes where it is emulated, and
        # an emulated bf16 trial on a V100 or T4 is slower and measures nothing a user wants.
        bf16 = native_bf16(torch) if cuda else True
        compiler = cuda or any(shutil.which(c) for c in ("g++", "c++", "clang++"))
        # FSDP2's fully_shard is public from torch 2.6; importing it to find out cost 0.3-0.7 s
        # of every search's start (torch.distributed.fsdp loads its whole package).
        fsdp2 = torch.distributed.is_available() and torch.__version__ >= (2, 6)
        return cls(cuda=cuda, bf16=bf16, fp16=cuda, compiler=bool(compiler), fsdp2=fsdp2)


def native_bf16(torch: Any) -> bool:
    """Whether the current CUDA device runs bf16 natively, not emulated."""
    import inspect

    check = torch.cuda.is_bf16_supported
    if "including_emulation" in inspect.signature(check).parameters:
        return bool(check(including_emulation=False))
    return bool(check())


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
    fsdp: FsdpMode = "off"
    activation_checkpointing: CheckpointMode = "none"
    compile: bool = False
    ddp_bucket_cap_mb: int = 25
    overlap_comm: bool = False
    reduce_bucket_size: int = DEEPSPEED_BUCKET
    allgather_bucket_size: int = DEEPSPEED_BUCKET
    offload_optimizer: OffloadMode = "none"
    optimizer_impl: OptimizerImpl = "default"
    engine: Literal["torch", "deepspeed", "fsdp"] = "torch"
    """``torch`` (plain or DDP), ``deepspeed`` or ``fsdp`` (FSDP2); derived from ``zero_stage``,
    ``fsdp`` and the recipe."""

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
    values = defaults()
    values.update(knobs)
    if values["micro_batch_size"] is None:
        values["micro_batch_size"] = default_micro_batch(global_batch_size, world_size)
    notes: list[str] = []
    for name, value, reason, fallback in unsupported(machine):
        if values[name] == value:
            notes.append(f"{name}={_fmt(value)} cannot apply here ({reason}); using {_fmt(fallback)}")
            values[name] = fallback
    check_divisible(global_batch_size, [values["micro_batch_size"]], world_size, "micro_batch_size")
    why = conflict(values)
    if why is not None:
        raise RecipeError(why)
    for name in KNOBS:  # a knob that means nothing here takes its default (one config, one key)
        if not applies(name, values, world_size):
            values[name] = KNOBS[name].default
    if engine == "torch" and values["zero_stage"] > 0:
        raise RecipeError(
            f"zero_stage: {values['zero_stage']} needs DeepSpeed, but the recipe says engine: torch; "
            "use engine: auto or deepspeed, or zero_stage: 0"
        )
    if engine == "deepspeed" and values["fsdp"] != "off":
        raise RecipeError(f"fsdp: {values['fsdp']} is PyTorch's FSDP2, but the recipe says engine: deepspeed; "
                          "use engine: auto, or zero_stage for DeepSpeed's sharding")
    if values["fsdp"] != "off":
        resolved_engine = "fsdp"
    else:
        resolved_engine = "deepspeed" if engine == "deepspeed" or values["zero_stage"] > 0 else "torch"
    accum = global_batch_size // (values["micro_batch_size"] * world_size)
    return Config(grad_accum_steps=accum, engine=resolved_engine, **values), notes


def unsupported(machine: Machine) -> list[tuple[str, Any, str, Any]]:
    """(knob, value, why it cannot run here, what to use instead)."""
    rows = []
    if not machine.compiler:
        rows.append(("compile", True, "torch.compile's inductor needs a C++ compiler on the PATH "
                     "(g++ or clang++) for CPU code, and none was found", False))
    if not machine.fsdp2:
        for mode in get_args(FsdpMode)[1:]:
            rows.append(("fsdp", mode, "this PyTorch has no torch.distributed.fsdp.fully_shard (FSDP2 needs "
                         "torch >= 2.6)", "off"))
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
