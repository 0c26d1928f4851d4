"""The parallel layout's arithmetic: how the tensor-parallel x pipeline x data-parallel
degrees make up the world, whether the data-parallel dimension is sharded or replicated,
and where a rank sits in it (what refuses a layout before anything runs: :mod:`tuner.inputs.rules`).

A plan derives its :class:`Layout` once (:attr:`tuner.inputs.plan.Plan.layout`): everything
after it (the preparation, the exports, the memory model, the reports) reads the layout, as
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


def ranks_per_node(world: int) -> int | None:
    """Ranks on one node, as torchrun says (``LOCAL_WORLD_SIZE``), for a job of ``world``
    ranks; ``None`` outside torchrun, or where the environment describes another job (a
    library that set up a one-process group left ``LOCAL_WORLD_SIZE=1`` behind in a test
    process planning for four ranks, refusing every tensor-parallel degree)."""
    value, job = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if not (value and value.isdigit() and job and job.isdigit()) or int(job) != world:
        return None
    return int(value)
