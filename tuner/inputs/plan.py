"""The configuration of one trial, in sections: what the loader, the precision, the batch,
the parallel layout, the sharding, the checkpointing, the kernels and the process run with.

A :class:`Plan` is complete and normalised (:func:`tuner.inputs.space.make_config` builds
it: the accumulation derived from the global batch, a knob that means nothing at its
default); its world and :class:`~tuner.inputs.layout.Layout` are derived once, inside it.
Every layer reads a section (``plan.sharding.zero_stage``) or, as a task's
``parallelize(model, mesh, config)`` and a script's ``tuner.config()`` do, the flat name
(``plan.zero_stage``); the search records :meth:`Plan.params`, flat. The sections are the
one table of the knobs' kinds, defaults and values: a lever
(:class:`~tuner.inputs.lever.Lever`) reads its field, and each section refuses a value
its field does not take.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from tuner.inputs import layout


class _Section:
    """A section checks each value against its field's type when it is made: a plan holds
    only values its knobs can take (a choice among its ``Literal``'s, an ``int`` that is no
    ``bool``), whoever builds it (the search, a recorded result, ``tuner.config()``)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            kind, _, values = field_of(f.name)
            value = getattr(self, f.name)
            fits = value in values if values is not None else type(value) is kind and (kind is bool or value >= 0)
            if not fits or (f.name in BATCH and value < 1):
                wanted = " | ".join(map(repr, values)) if values is not None else \
                    "true or false" if kind is bool else "a whole number >= " + ("1" if f.name in BATCH else "0")
                raise ValueError(f"{f.name}: {value!r} is not a value it takes ({wanted})")


@dataclass(frozen=True)
class Loader(_Section):
    """Each rank's ``torch.utils.data.DataLoader``."""

    num_workers: int = 0
    """Worker processes (0: the training process loads)."""
    prefetch_factor: int = 2
    """Batches each worker loads ahead (with workers)."""
    pin_memory: bool = False
    """Batches in page-locked host memory, for an asynchronous copy to the GPU."""
    persistent_workers: bool = False
    """Workers kept between epochs."""
    in_order: bool = True
    """Batches handed over in the sampler's order (``False``: as the workers finish them)."""


@dataclass(frozen=True)
class Batch(_Section):
    """The global batch, held fixed: micro-batch x accumulation x data-parallel ranks."""

    micro_batch_size: int
    """Samples per forward on one rank."""
    grad_accum_steps: int
    """Micro-batches per optimizer step (derived from the global batch)."""


@dataclass(frozen=True)
class Precision(_Section):
    """What the arithmetic runs in."""

    amp_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """The autocast dtype (fp32: no autocast; fp16 with loss scaling)."""
    float8: Literal["off", "tensorwise", "rowwise"] = "off"
    """torchao's float8 training of the Linear layers, by its scaling."""
    matmul_precision: Literal["highest", "high", "medium"] = "highest"
    """``torch.set_float32_matmul_precision`` (high: TF32)."""


@dataclass(frozen=True)
class Parallel(_Section):
    """How one model copy spans ranks (tensor x pipeline), data parallelism over the rest."""

    tensor_parallel: int = 1
    """Ranks each layer's matmuls are split over."""
    pipeline_parallel: int = 1
    """Pipeline stages of consecutive blocks."""
    pipeline_schedule: Literal["1f1b", "gpipe", "interleaved_1f1b"] = "1f1b"
    """The pipeline's schedule."""
    sequence_parallel: bool = False
    """The norms and dropout sharded over the sequence (with tensor parallelism)."""


@dataclass(frozen=True)
class Sharding(_Section):
    """How the data-parallel ranks hold and reduce the model's states."""

    zero_stage: int = 0
    """DeepSpeed's ZeRO stage (0: plain data parallelism)."""
    fsdp: Literal["off", "full_shard", "shard_grad_op"] = "off"
    """FSDP2 over the data-parallel ranks, resharding after the forward or not."""
    ddp_bucket_cap_mb: int = 25
    """DDP's gradient bucket size."""
    gradient_as_bucket_view: bool = False
    """DDP's gradients as views into its all-reduce buckets: no copy between the two, and one
    gradient's memory fewer."""
    static_graph: bool = False
    """DDP told the model's graph is the same every step: no search for unused parameters,
    and its buckets rebuilt once in the order the gradients arrive."""
    overlap_comm: bool = False
    """ZeRO's reduction overlapped with the backward."""
    reduce_bucket_size: int = 500_000_000
    """ZeRO's reduction bucket, in elements (DeepSpeed's default)."""
    allgather_bucket_size: int = 500_000_000
    """ZeRO-1/2's parameter all-gather bucket, in elements."""
    offload_optimizer: Literal["none", "cpu"] = "none"
    """The optimizer's states and step on the host (with sharding)."""


@dataclass(frozen=True)
class Checkpointing(_Section):
    """What the backward recomputes instead of holding."""

    activation_checkpointing: Literal["none", "op", "selective", "full"] = "none"
    """Per operator (op), every second block (selective), or every block (full)."""


@dataclass(frozen=True)
class Kernels(_Section):
    """Which kernels run the model and the optimizer."""

    compile: bool = False
    """``torch.compile`` of each block (or the model)."""
    optimizer_impl: Literal["default", "foreach", "fused"] = "default"
    """AdamW's implementation (default: the job's own optimizer as it builds it)."""
    channels_last: bool = False
    """The model's and the image batches' memory format."""
    cudnn_benchmark: bool = False
    """cuDNN's convolution algorithms chosen by timing."""
    compile_mode: Literal["default", "max-autotune-no-cudagraphs", "reduce-overhead"] = "default"
    """``torch.compile``'s mode (with ``compile``)."""
    attention_backend: Literal["default", "math", "flash", "efficient", "cudnn"] = "default"
    """The scaled-dot-product attention kernel."""
    fused_loss: bool = False
    """Liger's fused linear cross-entropy (the head and the loss in chunks)."""


@dataclass(frozen=True)
class Process(_Section):
    """Process-wide settings of each rank."""

    expandable_segments: bool = False
    """The CUDA caching allocator's expandable segments."""
    intra_op_threads: int = 0
    """``torch.set_num_threads`` (0: torch's own choice)."""


SECTIONS: dict[str, type] = {"loader": Loader, "batch": Batch, "precision": Precision, "parallel": Parallel,
                             "sharding": Sharding, "checkpointing": Checkpointing, "kernels": Kernels,
                             "process": Process}
"""Each section of a plan, by its attribute."""
SECTION_OF: dict[str, str] = {f.name: section for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
"""The section of each knob (and of the derived ``grad_accum_steps``)."""
FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
"""Every knob's field: its type and default, the one table of them."""
BATCH = ("micro_batch_size", "grad_accum_steps")
"""The batch's fields, each at least 1."""


@functools.cache
def field_of(name: str) -> tuple[type, Any, tuple[Any, ...] | None]:
    """A knob's kind (``int``, ``bool``, or ``str`` for a choice), default (``None``: none)
    and values (a choice's, as its ``Literal`` lists them)."""
    hint = typing.get_type_hints(SECTIONS[SECTION_OF[name]])[name]
    default = FIELDS[name].default
    default = None if default is dataclasses.MISSING else default
    if typing.get_origin(hint) is Literal:
        return str, default, typing.get_args(hint)
    return hint, default, None


ORDER = (
    "num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "amp_dtype", "micro_batch_size",
    "tensor_parallel", "pipeline_parallel", "pipeline_schedule", "sequence_parallel", "zero_stage", "fsdp",
    "activation_checkpointing", "compile", "ddp_bucket_cap_mb", "overlap_comm", "reduce_bucket_size",
    "allgather_bucket_size", "offload_optimizer", "optimizer_impl", "matmul_precision", "channels_last",
    "cudnn_benchmark", "in_order", "compile_mode", "attention_backend", "float8", "expandable_segments",
    "fused_loss", "intra_op_threads", "gradient_as_bucket_view", "static_graph",
)
"""Every knob in a configuration's order: the registry's (:data:`tuner.inputs.levers.LEVERS`),
trials.csv's columns, the sampler's questions (a new knob goes last: the same seed then draws
the same configurations of the others)."""
DEFAULTS: dict[str, Any] = {name: field_of(name)[1] for name in ORDER}
"""Every knob at its field's default (``micro_batch_size`` ``None``: no accumulation)."""
PARAMS = ("micro_batch_size", "grad_accum_steps", *(name for name in ORDER if name != "micro_batch_size"), "engine")
"""The order of :meth:`Plan.params` (best.json's keys)."""


@dataclass(frozen=True)
class Plan:
    """One complete configuration of a trial on ``world_size`` ranks, in sections, with
    ``engine``: the label of what runs it (:func:`tuner.inputs.engine.engine_of`)."""

    world_size: int = field(repr=False)
    batch: Batch
    loader: Loader = Loader()
    precision: Precision = Precision()
    parallel: Parallel = Parallel()
    sharding: Sharding = Sharding()
    checkpointing: Checkpointing = Checkpointing()
    kernels: Kernels = Kernels()
    process: Process = Process()
    engine: str = "torch"

    @classmethod
    def of(cls, world_size: int, engine: str = "torch", **knobs: Any) -> "Plan":
        """The plan of flat knob values (every knob not given at its default)."""
        unknown = set(knobs) - set(SECTION_OF)
        if unknown:
            raise TypeError(f"Plan.of() got unexpected knob(s) {', '.join(sorted(unknown))}")
        sections = {name: cls_(**{f.name: knobs[f.name] for f in dataclasses.fields(cls_) if f.name in knobs})
                    for name, cls_ in SECTIONS.items()}
        return cls(world_size=world_size, engine=engine, **sections)

    @classmethod
    def recorded(cls, world_size: int, params: Mapping[str, Any]) -> "Plan":
        """The plan a trial recorded (its :meth:`params`), as it ran: nothing derived again; a
        name no knob has now (a lever since removed) is passed over, a knob added since takes
        its default. ``ValueError``: a value its knob does not take."""
        return cls.of(world_size, **{k: v for k, v in params.items() if k in SECTION_OF or k == "engine"})

    @classmethod
    def batched(cls, world_size: int, global_batch: int, engine: str = "torch", **knobs: Any) -> "Plan":
        """The plan of these knobs making up ``global_batch``: the accumulation derived over its
        data-parallel degree, and a micro-batch not given (``None``) each model copy's whole share."""
        micro = knobs.pop("micro_batch_size", None)
        shape = cls.of(world_size, engine, micro_batch_size=1, grad_accum_steps=1, **knobs)
        dp = shape.layout.dp
        micro = global_batch // dp if micro is None else micro
        return dataclasses.replace(shape, batch=Batch(micro, max(1, global_batch // (micro * dp))))

    def replace(self, **knobs: Any) -> "Plan":
        """The same plan with these knobs changed (flat names; ``engine`` too)."""
        engine = knobs.pop("engine", self.engine)
        unknown = set(knobs) - set(SECTION_OF)
        if unknown:
            raise TypeError(f"Plan.replace() got unexpected knob(s) {', '.join(sorted(unknown))}")
        sections = {name: dataclasses.replace(getattr(self, name), **{k: v for k, v in knobs.items()
                                                                      if SECTION_OF[k] == name})
                    for name in {SECTION_OF[k] for k in knobs}}
        return dataclasses.replace(self, engine=engine, **sections)

    def __getattr__(self, name: str) -> Any:
        section = SECTION_OF.get(name)
        if section is None:  # copy and pickle look up their hooks here too
            raise AttributeError(f"'Plan' object has no attribute {name!r}")
        return getattr(getattr(self, section), name)

    def params(self) -> dict[str, Any]:
        """The knobs, flat, as recorded in results (the accumulation and the engine included)."""
        return {name: getattr(self, name) for name in PARAMS}

    @functools.cached_property
    def layout(self) -> layout.Layout:
        """How this plan places one model on its ``world_size`` ranks, derived once: the one
        reader of the layout levers (everything after reads the layout, as torchtitan's code
        reads its ``ParallelDims``)."""
        p, fsdp = self.parallel, self.sharding.fsdp
        return layout.Layout(p.tensor_parallel, p.pipeline_parallel, self.world_size, shard=fsdp != "off",
                             reshard=fsdp == "full_shard", schedule=p.pipeline_schedule)


