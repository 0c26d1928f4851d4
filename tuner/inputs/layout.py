"""The parallel layout's arithmetic: how the tensor-parallel x pipeline x data-parallel
degrees make up the world, whether the data-parallel dimension is sharded or replicated,
where a rank sits in it, and the rules that refuse a layout before anything runs.

:func:`of` is the one place that reads the layout levers' values: everything after it (the
preparation, the exports, the memory model, the reports) reads the :class:`Layout`, as
torchtitan's code reads its ``ParallelDims`` rather than its job config.

The mesh is torchtitan's order, ``(pp, dp, tp)`` with tensor parallelism innermost: the
ranks of one tensor-parallel group are consecutive, so they share a node (torchrun numbers
a node's ranks consecutively) and its fast links, which tensor parallelism's per-layer
all-reduces need. The data-parallel degree is what is left of the world; the global batch
is counted over it (``micro x accumulation x dp``), since the ranks of one model copy all
see the same samples.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b")
"""``pipeline_schedule`` values: torch.distributed.pipelining's Schedule1F1B,
ScheduleGPipe and ScheduleInterleaved1F1B (two virtual stages per rank)."""
VIRTUAL_STAGES = {"1f1b": 1, "gpipe": 1, "interleaved_1f1b": 2}
"""Stages each rank holds under each schedule."""


@dataclass(frozen=True)
class Layout:
    """One layout of ``world`` ranks: ``pp`` stages x ``dp`` model copies x ``tp`` shards;
    the ``dp`` copies are one sharded copy (FSDP2, ``shard``) or replicas."""

    tp: int
    pp: int
    world: int
    shard: bool = False
    """The data-parallel dimension shards parameters, gradients and optimizer states (FSDP2)."""
    reshard: bool = False
    """A sharded block frees its gathered parameters after the forward and gathers them again
    for the backward (FSDP2's full_shard; shard_grad_op keeps them)."""
    schedule: str = "1f1b"
    """The pipeline schedule (one of :data:`SCHEDULES`; meaningful with ``pp > 1``)."""

    @property
    def dp(self) -> int:
        """What is left of the world; 1 for a layout that does not divide it (refused by
        :func:`refusal` before it runs, it still has batch arithmetic that holds)."""
        copy = self.tp * self.pp
        return self.world // copy if self.world % copy == 0 else 1

    @property
    def dp_shard(self) -> int:
        """torchtitan's ``data_parallel_shard_degree`` (Accelerate's ``dp_shard_size``)."""
        return self.dp if self.shard else 1

    @property
    def dp_replicate(self) -> int:
        """torchtitan's ``data_parallel_replicate_degree``."""
        return 1 if self.shard else self.dp

    @property
    def virtual_stages(self) -> int:
        """Stages each rank holds (two under the interleaved schedule)."""
        return VIRTUAL_STAGES.get(self.schedule, 1) if self.pp > 1 else 1

    @property
    def model_parallel(self) -> bool:
        """Whether a model copy spans more than one rank (the layout engine runs it)."""
        return self.tp * self.pp > 1

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pipeline stage, data-parallel index, tensor-parallel index) of ``rank``, as
        ``init_device_mesh(..., (pp, dp, tp))`` places it (row-major)."""
        return rank // (self.dp * self.tp), (rank // self.tp) % self.dp, rank % self.tp

    def data_rank(self, rank: int) -> int:
        """Which slice of the global batch ``rank`` trains on."""
        return self.coordinates(rank)[1]


def of(knobs: Mapping[str, Any], world: int = 1) -> Layout:
    """The layout these knob values make on ``world`` ranks (the degrees alone need no world)."""
    shard = knobs.get("fsdp", "off")
    return Layout(int(knobs.get("tensor_parallel", 1)), int(knobs.get("pipeline_parallel", 1)), world,
                  shard=shard != "off", reshard=shard == "full_shard",
                  schedule=str(knobs.get("pipeline_schedule", "1f1b")))


def data_parallel(knobs: Mapping[str, Any], world: int) -> int:
    """The data-parallel degree of these knobs on ``world`` ranks."""
    return of(knobs, world).dp


def ranks_per_node(world: int) -> int | None:
    """Ranks on one node, as torchrun says (``LOCAL_WORLD_SIZE``), for a job of ``world``
    ranks; ``None`` outside torchrun, or where the environment describes another job (a
    library that set up a one-process group left ``LOCAL_WORLD_SIZE=1`` behind in a test
    process planning for four ranks, refusing every tensor-parallel degree)."""
    value, job = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if not (value and value.isdigit() and job and job.isdigit()) or int(job) != world:
        return None
    return int(value)


def refusal(knobs: Mapping[str, Any], world: int, per_node: int | None = None,
            blocks: int | None = None, cuda: bool = True) -> str | None:
    """Why this layout cannot run on ``world`` ranks (``None``: it can), naming the rule;
    ``cuda``: the ranks are GPUs (NCCL), else CPUs (gloo)."""
    layout = of(knobs, world)
    if not layout.model_parallel:
        return None
    copy = layout.tp * layout.pp
    if world % copy:
        return (f"tensor_parallel {layout.tp} x pipeline_parallel {layout.pp} = {copy} ranks per model copy does "
                f"not divide the world of {world} ranks (the rule: world = tp x pp x data-parallel degree)")
    if per_node is not None and layout.tp > per_node:
        return (f"tensor_parallel {layout.tp} spans more than one node's {per_node} ranks (the rule: a "
                "tensor-parallel group stays inside a node; its per-layer all-reduces need the node's links)")
    if knobs.get("amp_dtype") == "fp16":
        return ("amp_dtype fp16 with tensor or pipeline parallelism: its loss scaling is not composed with "
                "them here (the rule: use bf16, as torchtitan does)")
    schedule, accum = layout.schedule, knobs.get("grad_accum_steps")
    if not cuda and layout.pp > 1 and schedule == "interleaved_1f1b" and layout.shard:
        # measured: NaN from the first forward (1 micro-batch) or the second step (2), 4 gloo ranks, torch
        # 2.13, tiny Llama; the same layout without FSDP2, and FSDP2 under 1f1b, train the reference curve
        return ("pipeline_schedule interleaved_1f1b with fsdp trains NaN on CPU ranks (torch 2.13's runtime "
                "schedule and FSDP2 over gloo; the rule: on CPUs, interleave without fsdp or shard under 1f1b)")
    if layout.pp > 1 and isinstance(accum, int):
        if schedule == "1f1b" and accum < layout.pp:
            return (f"pipeline_schedule 1f1b runs {accum} micro-batch(es) per step through {layout.pp} stages (the "
                    "rule: at least one micro-batch per stage; a smaller micro_batch_size gives more)")
        rounds = max(1, accum // layout.pp)
        if schedule == "interleaved_1f1b" and accum % rounds:
            return (f"pipeline_schedule interleaved_1f1b runs {accum} micro-batches in rounds of {layout.pp} (the "
                    "rule: a whole number of rounds)")
    stages = layout.pp * layout.virtual_stages
    if blocks is not None and layout.pp > 1 and blocks < stages:
        return (f"pipeline_parallel {layout.pp} under {schedule} needs {stages} stages of at "
                f"least one block each; the model has {blocks} (the rule: blocks >= stages)")
    return None


def smallest_data_parallel(values: Mapping[str, tuple[Any, ...]], world: int) -> int:
    """The fewest model copies any layout of these lever values makes on ``world`` ranks:
    each micro-batch size must fit at least that one (the rest are refused per layout)."""
    degrees = [world // (t * p) for t in values.get("tensor_parallel", (1,))
               for p in values.get("pipeline_parallel", (1,)) if world % (t * p) == 0]
    return min(degrees, default=world)


def batch_refusal(params: Mapping[str, Any], world: int, global_batch: int) -> str | None:
    """Why a micro-batch size does not make up the global batch on this layout's
    data-parallel ranks (``None``: it does)."""
    dp = of(params, world).dp
    micro = params["micro_batch_size"]
    if global_batch % (micro * dp):
        return (f"micro_batch_size {micro} x {dp} data-parallel rank(s) does not divide global_batch_size "
                f"{global_batch} (the rule: global = micro x accumulation x data-parallel degree)")
    return None
