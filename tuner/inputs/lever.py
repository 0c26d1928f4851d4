"""What the tuner knows of one lever, in one declaration (:class:`Lever`).

Every layer reads its part from here: the recipe its values, the space what this machine
refuses of them, the trial where it is applied, the memory model its effect, the
attribution its risk, the console its label, script mode its routes, the exports the fields
it sets (its kind and default are its plan field's; what it needs, conflicts with and
refuses in a plan are :mod:`tuner.inputs.rules`): one declaration,
which ``tests/structure`` checks is complete, so no layer silently misses a knob. Where a
lever stands among the others (the search's orders, the verdicts that point at it) is
:mod:`tuner.inputs.levers.orders`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from tuner.inputs import plan
from tuner.inputs.errors import RecipeError
from tuner.inputs.machine import Machine

Group = Literal["loader", "precision", "batch", "layout", "sharding", "model", "kernels", "communication", "optimizer",
                "memory"]
"""What a lever acts on (the loader's levers are the ones a loader change is made of)."""
Memory = Literal["states", "activations", "per_sample", "workers", "none"]
"""How a lever moves a rank's peak memory, as the memory model and ``tuner plan`` take it:
``states`` (parameters, gradients, optimizer: sharding and offload, analytic),
``activations`` (scales the per-sample slope by :attr:`MemoryTerm.prior`), ``per_sample`` (the
micro-batch itself), ``workers`` (what each loader worker holds), ``none``."""
Stage = Literal["loader", "process", "model", "engine", "optimizer", "batch", "forward", "convert"]
"""Where a trial applies it: DataLoader keyword, process-wide setting held for the trial
(then restored), the model before the engine wraps it, the engine, the optimizer, the
training loop's batch arithmetic, a context around each forward (autocast, the attention kernel),
a converter of the model's layers before anything else touches it (low-precision layers,
a fused loss: :mod:`tuner.trial.engines.stages`)."""
ADAPTERS = ("torch", "hf", "lightning", "accelerate", "deepspeed")
EXPORT_FILES = ("dataloader.json", "ds_config.json", "accelerate_config.yaml", "hf_training_args.json",
                "torchtitan.toml", "torch_settings.py", "lightning_trainer.yaml")
"""The run folder's configs to paste; every lever reaches at least one."""
UNGUARDED = object()
""":attr:`Lever.reference` of a lever that leaves a step's arithmetic alone."""


def never_refused(machine: Machine) -> list[tuple[Any, str, Any]]:
    return []


@dataclass(frozen=True)
class Applied:
    """Where a trial applies the lever, and with what."""

    stage: Stage = "engine"
    """The trial's functions of a stage are called in a written-out order by
    :mod:`tuner.trial.engines.stages` (forward, convert, model, optimizer) and
    :mod:`tuner.trial.engines.process` (process); an engine applies its own."""
    loader_kwarg: str | None = None
    """Its ``torch.utils.data.DataLoader`` keyword (loader levers)."""
    kwarg_at_default: bool = True
    """Whether the keyword is passed at its default too (``False`` for one only recent
    DataLoaders take: a pasted ``dataloader.json`` then runs on an older PyTorch)."""
    hold: Callable[[Any], Callable[[], None]] | None = None
    """A ``process`` lever's setter: ``(value)`` -> how to put the process's own setting back
    (:func:`tuner.trial.engines.process.held`)."""
    env: Callable[[Any, Mapping[str, str]], dict[str, str]] | None = None
    """For a lever a process reads from its environment at start (the CUDA allocator's
    settings): ``(value, the environment so far)`` -> the variables a script trial's process
    gets. Script mode sets them for every adapter."""


@dataclass(frozen=True)
class Exported:
    """What it writes into the configs to paste."""

    fields: Mapping[str, str] = field(default_factory=dict)
    """Export file -> the field it sets there (see :data:`EXPORT_FILES`)."""


@dataclass(frozen=True)
class MemoryTerm:
    """How it moves a rank's peak memory, as the memory model and ``tuner plan`` take it."""

    effect: Memory = "none"
    prior: Mapping[Any, float] = field(default_factory=dict)
    """For an ``activations`` lever: each value's activation memory against the default's,
    until the trials measure it."""
    states: Callable[[plan.Plan, int, bool], tuple[float, float, float]] | None = None
    """``(plan, data-parallel ranks, host is the device)`` -> the share of the parameters,
    gradients and optimizer states a rank keeps on its device (:mod:`tuner.inputs.model_states`):
    the memory model multiplies every lever's."""
    frees_activations: tuple[Any, ...] = ()
    """Values that recompute activations in the backward instead of holding them, the one
    that recomputes least first: what the guided walk tries on a larger micro-batch the
    memory budget refused, and the capacity plan's checkpointing column."""


@dataclass(frozen=True)
class ScriptRoutes:
    """Script mode's side: the adapters that deliver it themselves (others need ``knobs:`` /
    ``env:``), and what an adapter's library refuses on this machine."""

    adapters: frozenset[str] = frozenset()
    refused_under: Mapping[str, Callable[[Machine], list[tuple[Any, str, Any]]]] = field(default_factory=dict)
    """Adapter -> what that adapter's library refuses, as :attr:`Lever.refused` (Lightning's
    DeepSpeed strategy needs CUDA, whatever DeepSpeed can do)."""


@dataclass(frozen=True)
class Lever:
    """One tunable setting: its values, and what every layer of the tuner does with it."""

    name: str
    """The knob's name: its field in :mod:`tuner.inputs.plan`, which gives its kind, default
    and values."""
    help: str
    minimum: int | None = None
    maximum: int | None = None
    aliases: tuple[tuple[Any, Any], ...] = ()
    """Values read as another: YAML 1.1 reads a bare ``off`` as false (``[off, full_shard]``)."""
    group: Group = "model"
    refused: Callable[[Machine], list[tuple[Any, str, Any]]] = never_refused
    """(value, why it cannot run on this machine, what runs instead)."""
    ordered: bool = False
    """Its values lie on a line (by number, else as the choices list them), each step buying
    one thing at a growing price: the guided walk does not go past one that lost."""
    alternative: tuple[str, Any] | None = None
    """Moving to this lever leaves that one at that value (FSDP2 and ZeRO never together)."""
    risk: str = ""
    """What the change can cost besides speed, in the attribution table."""
    label: str | None = None
    """How its value reads in a result row (``"prefetch={}"``): always for the levers of the
    row's title (:data:`tuner.inputs.levers.orders.TITLE`), else away from its default."""
    suggest: tuple[tuple[Any, ...], str] | None = None
    """What a verdict pointing at it suggests: (the values that already follow the advice,
    the words); ``None``: the verdict's own words cover it."""
    advises: tuple[Any, ...] | None = None
    """The values the suggestion's words name (``None``: every value that follows it): once
    the trials moved the knob to each of them, a verdict no longer advises it."""
    acts_on: Literal["convolutions", "attention"] | None = None
    """What the model must hold for the lever to act (convolutions; calls of
    scaled_dot_product_attention): a trial records what its model holds (``ran["model"]``,
    :func:`tuner.trial.run.model_facts`) and the advice leaves the lever out where it is not
    there (a transformer was advised cuDNN's convolution search)."""
    reference: Any = UNGUARDED
    """The value the precision guard's reference runs at, for a lever that changes a
    step's arithmetic (reduced precision and compiled kernels round differently)."""
    engine: str | None = None
    """The engine label a value away from the default gives a configuration (``deepspeed``, or
    a label of the PyTorch engine's for sharding or a layout: what trials.csv says ran it;
    the first of :data:`tuner.inputs.engine.ORDER` wins)."""
    runs_on: str | None = None
    """The recipe ``engine`` (``torch`` or ``deepspeed``) a value away from the default needs:
    a recipe that names the other one is refused before anything runs."""
    proven: bool = False
    """It stays in an answer only where the interval shows it a gain beyond the tolerance, or
    the answer does not fit without it: what it buys is memory, and a change that costs
    speed and the user's checkpoint format is not pasted on a coin flip (the others stay while
    the rule cannot decide: a change the search measured leaves only on evidence)."""
    applied: Applied = field(default_factory=Applied)
    exported: Exported = field(default_factory=Exported)
    memory: MemoryTerm = field(default_factory=MemoryTerm)
    script: ScriptRoutes = field(default_factory=ScriptRoutes)

    @property
    def kind(self) -> type:
        """``int``, ``bool`` or ``str`` (a choice of :attr:`choices`)."""
        return plan.field_of(self.name)[0]

    @property
    def default(self) -> Any:
        """Its plan field's default (``None`` for ``micro_batch_size``: no accumulation)."""
        return plan.field_of(self.name)[1]

    @property
    def choices(self) -> tuple[Any, ...] | None:
        """A choice's values, as its field's ``Literal`` lists them."""
        return plan.field_of(self.name)[2]

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

    @property
    def guarded(self) -> bool:
        return self.reference is not UNGUARDED

    def line(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        """An :attr:`ordered` lever's values in line order."""
        return tuple(sorted(values)) if self.kind is int else tuple(v for v in self.choices or () if v in values)
