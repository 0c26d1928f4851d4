"""The rules of the knobs, each a small function, in one module: which knob means nothing
given the others (:data:`NEEDS`), which values are no configuration at all
(:data:`CONFLICTS`), and why a plan cannot run here (:data:`RULES`, each naming itself:
"the rule: ...").

Needs and conflicts are asked of a point of the space, before there is a plan (the sampler
asks a knob only where it applies; :func:`tuner.inputs.space.make_config` resets the
meaningless ones, so two points that train alike are one plan). A refusal is asked of the
plan, and the search records it ``skipped`` without running it. What a machine cannot run
whatever the plan is a lever's own ``refused``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tuner.inputs.machine import Machine
from tuner.inputs.plan import DEFAULTS, Plan

Knobs = Mapping[str, Any]
"""A point of the space: each knob's value (every knob's, where a rule reads the others)."""


def _workers(k: Knobs, world: int) -> bool:
    return k["num_workers"] > 0  # DataLoader refuses these without workers


def _several(k: Knobs, world: int) -> bool:
    return world > 1


def _data_parallel_only(k: Knobs, world: int) -> bool:
    """DeepSpeed's engine and offload take no PyTorch tensor/pipeline layout: with one they
    mean nothing (the layout's data-parallel dimension shards with FSDP2 instead)."""
    return k["tensor_parallel"] == k["pipeline_parallel"] == 1


def _zero(k: Knobs, world: int) -> bool:
    return k["zero_stage"] >= 1


def _ddp(k: Knobs, world: int) -> bool:
    """DDP's own levers: several ranks replicating the whole model, neither ZeRO nor FSDP2."""
    return world > 1 and k["zero_stage"] == 0 and k["fsdp"] == "off" and _data_parallel_only(k, world)


NEEDS: dict[str, Callable[[Knobs, int], bool]] = {
    "prefetch_factor": _workers,
    "persistent_workers": _workers,
    "in_order": _workers,
    "tensor_parallel": _several,
    "pipeline_parallel": _several,
    "pipeline_schedule": lambda k, w: k["pipeline_parallel"] > 1,
    "sequence_parallel": lambda k, w: k["tensor_parallel"] > 1 and k["pipeline_parallel"] == 1,
    "zero_stage": _data_parallel_only,
    "fsdp": lambda k, w: k["zero_stage"] == 0,
    "ddp_bucket_cap_mb": _ddp,
    "gradient_as_bucket_view": _ddp,
    "static_graph": _ddp,
    "overlap_comm": _zero,
    "reduce_bucket_size": _zero,
    "allgather_bucket_size": lambda k, w: k["zero_stage"] in (1, 2),
    "offload_optimizer": lambda k, w: (k["zero_stage"] >= 1 or k["fsdp"] != "off") and _data_parallel_only(k, w),
    "compile_mode": lambda k, w: k["compile"],
}
"""Each knob that means something only given others (and the world size); the rest always do."""


def applies(name: str, knobs: Knobs, world_size: int) -> bool:
    """Whether knob ``name`` means anything given the others (``knobs`` holds those its rule
    reads). One rule for two uses: :func:`tuner.inputs.space.make_config` resets a knob that
    means nothing to its default, and the search only asks the sampler for a knob where it
    applies."""
    rule = NEEDS.get(name)
    return rule is None or rule(knobs, world_size)


def _fsdp_and_zero(k: Knobs) -> str | None:
    if k["fsdp"] != "off" and k["zero_stage"] > 0:
        return (f"fsdp: {k['fsdp']} and zero_stage: {k['zero_stage']} are two ways to shard the same "
                "model; choose one (fsdp: off, or zero_stage: 0)")
    return None


def _offload_unsharded(k: Knobs) -> str | None:
    if k["offload_optimizer"] != "none" and k["zero_stage"] == 0 and k["fsdp"] == "off":
        return ("offload_optimizer: cpu needs a sharded optimizer to offload; use it with zero_stage >= 1 "
                "or fsdp: full_shard / shard_grad_op")
    return None


CONFLICTS: tuple[Callable[[Knobs], str | None], ...] = (_fsdp_and_zero, _offload_unsharded)
"""Values that cannot go together, asked in this order."""


def conflict(knobs: Knobs) -> str | None:
    """Why a set of knob values is not a configuration at all (``None`` if it is one); a knob
    not given is at its default."""
    point = {**DEFAULTS, **knobs}
    return next((why for rule in CONFLICTS if (why := rule(point)) is not None), None)


def smallest_data_parallel(values: Mapping[str, tuple[Any, ...]], world: int) -> int:
    """The fewest model copies any layout of these lever values makes on ``world`` ranks:
    each micro-batch size must fit at least that one (the rest are refused per layout)."""
    degrees = [world // (t * p) for t in values.get("tensor_parallel", (1,))
               for p in values.get("pipeline_parallel", (1,)) if world % (t * p) == 0]
    return min(degrees, default=world)


@dataclass(frozen=True)
class Where:
    """What the rules read besides the plan."""

    machine: Machine
    per_node: int | None = None
    """Ranks per node (a tensor-parallel group stays inside one); ``None``: not known."""
    blocks: int | None = None
    """The model's blocks (a pipeline stage holds one at least); ``None``: not known."""
    global_batch: int | None = None
    """The global batch the micro-batch must make up; ``None``: checked where the plan was made."""


def _batch(p: Plan, where: Where) -> str | None:
    dp, micro = p.layout.dp, p.batch.micro_batch_size
    if where.global_batch is not None and where.global_batch % (micro * dp):
        return (f"micro_batch_size {micro} x {dp} data-parallel rank(s) does not divide global_batch_size "
                f"{where.global_batch} (the rule: global = micro x accumulation x data-parallel degree)")
    return None


def _layout(p: Plan, where: Where) -> str | None:
    lay, world = p.layout, p.world_size
    if not lay.model_parallel:
        return None
    copy = lay.tp * lay.pp
    if world % copy:
        return (f"tensor_parallel {lay.tp} x pipeline_parallel {lay.pp} = {copy} ranks per model copy does "
                f"not divide the world of {world} ranks (the rule: world = tp x pp x data-parallel degree)")
    if where.per_node is not None and lay.tp > where.per_node:
        return (f"tensor_parallel {lay.tp} spans more than one node's {where.per_node} ranks (the rule: a "
                "tensor-parallel group stays inside a node; its per-layer all-reduces need the node's links)")
    if p.precision.amp_dtype == "fp16":
        return ("amp_dtype fp16 with tensor or pipeline parallelism: its loss scaling is not composed with "
                "them here (the rule: use bf16, as torchtitan does)")
    return _pipeline(p, where)


def _pipeline(p: Plan, where: Where) -> str | None:
    lay, accum = p.layout, p.batch.grad_accum_steps
    if not where.machine.cuda and lay.pp > 1 and lay.schedule == "interleaved_1f1b" and lay.shard:
        # measured: NaN from the first forward (1 micro-batch) or the second step (2), 4 gloo ranks, torch
        # 2.13, tiny Llama; the same layout without FSDP2, and FSDP2 under 1f1b, train the reference curve
        return ("pipeline_schedule interleaved_1f1b with fsdp trains NaN on CPU ranks (torch 2.13's runtime "
                "schedule and FSDP2 over gloo; the rule: on CPUs, interleave without fsdp or shard under 1f1b)")
    if lay.pp > 1:
        if lay.schedule == "1f1b" and accum < lay.pp:
            return (f"pipeline_schedule 1f1b runs {accum} micro-batch(es) per step through {lay.pp} stages (the "
                    "rule: at least one micro-batch per stage; a smaller micro_batch_size gives more)")
        rounds = max(1, accum // lay.pp)
        if lay.schedule == "interleaved_1f1b" and accum % rounds:
            return (f"pipeline_schedule interleaved_1f1b runs {accum} micro-batches in rounds of {lay.pp} (the "
                    "rule: a whole number of rounds)")
    stages = lay.pp * lay.virtual_stages
    if where.blocks is not None and lay.pp > 1 and where.blocks < stages:
        return (f"pipeline_parallel {lay.pp} under {lay.schedule} needs {stages} stages of at "
                f"least one block each; the model has {where.blocks} (the rule: blocks >= stages)")
    return None


def _graphs(p: Plan, where: Where) -> str | None:
    """What CUDA graphs (``reduce-overhead``) cannot capture."""
    if not p.kernels.compile or p.kernels.compile_mode != "reduce-overhead":
        return None
    lay = p.layout
    if lay.shard or p.sharding.zero_stage > 0:
        return ("compile_mode reduce-overhead records CUDA graphs, which cannot capture FSDP2's or ZeRO's hooks and "
                "collectives (the rule: reduce-overhead without sharding)")
    if lay.model_parallel:
        return ("compile_mode reduce-overhead with a parallel layout: CUDA graphs cannot capture its stages' sends "
                "and DTensor's collectives here (the rule: reduce-overhead without tensor or pipeline parallelism)")
    return None


def _attention(p: Plan, where: Where) -> str | None:
    backend = p.kernels.attention_backend
    if where.machine.cuda and backend in ("flash", "cudnn") and p.precision.amp_dtype == "fp32":
        return (f"attention_backend {backend} runs fp16 and bf16 inputs only, and amp_dtype fp32 gives it fp32 (the "
                "rule: with amp_dtype bf16 or fp16; efficient and math take fp32)")
    return None


def _float8(p: Plan, where: Where) -> str | None:
    if p.precision.float8 == "off":
        return None
    if p.sharding.zero_stage > 0:
        return "float8 with DeepSpeed's ZeRO: its engine does not compose with torchao's float8 layers (the rule: " \
               "float8 with FSDP2 or plain data parallelism, as torchtitan runs it)"
    if p.layout.tp > 1:
        return "float8 with tensor parallelism needs torchao's float8 parallel styles, not applied here (the rule: " \
               "float8 without tensor parallelism)"
    return None


def _fused_loss(p: Plan, where: Where) -> str | None:
    """Liger's kernel takes the whole head and the model's own forward: a tensor-parallel head
    is a DTensor shard (its loss runs vocabulary-parallel instead), and pipeline stages call
    the blocks, not the patched forward."""
    if p.kernels.fused_loss and p.layout.model_parallel:
        return ("fused_loss with a parallel layout: Liger's fused cross-entropy takes the whole head through the "
                "model's own forward, which tensor parallelism shards and pipeline stages do not call (the rule: "
                "fused_loss without tensor or pipeline parallelism; tensor parallelism's loss runs "
                "vocabulary-parallel)")
    return None


def _static_graph(p: Plan, where: Where) -> str | None:
    """DDP's static graph counts its first iteration by backward calls, so the no-sync
    backward of an accumulation's first micro-batch trips its reducer (torch 2.13)."""
    if p.sharding.static_graph and p.batch.grad_accum_steps > 1:
        return (f"static_graph with {p.batch.grad_accum_steps} micro-batches a step: PyTorch's DDP asserts in the "
                "first backward that skips the all-reduce (pytorch/pytorch#143580) (the rule: static_graph without "
                "gradient accumulation)")
    return None


RULES: tuple[Callable[[Plan, Where], str | None], ...] = (_batch, _layout, _graphs, _attention, _float8, _fused_loss,
                                                         _static_graph)
"""Every rule, asked in this order: the first that refuses is the one said."""


def refusal(plan: Plan, where: Where) -> str | None:
    """Why ``plan`` cannot run ``where`` (the first rule that refuses it), or ``None``: it can."""
    return next((why for rule in RULES if (why := rule(plan, where)) is not None), None)
