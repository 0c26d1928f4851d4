"""A pipeline step: this rank's stages run by PyTorch's schedule.

The micro-batches of one optimizer step are gathered and run together by the schedule
(``grad_accum_steps`` micro-batches per pipeline step: 1F1B, GPipe or interleaved 1F1B), and
the last stage's loss is sent to the others, so every rank records the same curve. Each
pipeline step is timed with the stages' work inside it: the bubble share
(:mod:`tuner.trial.engines.pipeline_clock`). A tied embedding's two copies (first and last
stage) get the sum of their gradients before the optimizer step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from tuner.inputs import layout as layouts
from tuner.trial import pipeline_stages
from tuner.trial.engines.pipeline_clock import PipelineClock

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.task import Task
    from tuner.trial.engines.parallelize import Parallelized

_ENDS: dict[tuple[int, int, int, int], Any] = {}


def _ends_group(lay: layouts.Layout, rank: int) -> Any:
    """The group of the first and the last pipeline stage of ``rank``'s model copy. Every
    rank creates every such group, in the same order, once per layout (``new_group`` is
    collective); the pipeline's own group is it when there are two stages."""
    key = (lay.tp, lay.pp, lay.dp, rank)
    if key not in _ENDS:
        mine = None
        for d in range(lay.dp):
            for t in range(lay.tp):
                pair = [d * lay.tp + t, ((lay.pp - 1) * lay.dp + d) * lay.tp + t]
                group = dist.new_group(pair)
                if rank in pair:
                    mine = group
        _ENDS[key] = mine
    return _ENDS[key]


def _local(grad: torch.Tensor) -> torch.Tensor:
    """A gradient's local shard: a DTensor's (tensor parallelism, FSDP2) or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return grad.to_local() if isinstance(grad, DTensor) else grad


class PipelineSteps:
    """This rank's stages under their schedule, fed one micro-batch at a time."""

    def __init__(self, prepared: "Parallelized", task: "Task", config: "Plan", device: torch.device) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        self.layout, self.mesh, self.parts, self.tied = prepared.layout, prepared.mesh, prepared.parts, prepared.tied
        self.config, self.device = config, device
        self.clock = PipelineClock(device)
        """Each pipeline step and the stages' work inside it: the bubble (:mod:`.pipeline_clock`)."""
        group = self.mesh["pp"].get_group()
        stages = [PipelineStage(part, i, prepared.stages, device, group=group)
                  for part, i in zip(prepared.parts, prepared.indices)]
        for stage in stages:
            self.clock.watch(stage)
        loss = task.pipeline_loss or pipeline_stages.next_token_loss
        accum = config.grad_accum_steps
        if config.pipeline_schedule == "interleaved_1f1b":
            self.schedule: Any = ScheduleInterleaved1F1B(stages, n_microbatches=accum, loss_fn=loss)
        else:
            cls = ScheduleGPipe if config.pipeline_schedule == "gpipe" else Schedule1F1B
            self.schedule = cls(stages[0], n_microbatches=accum, loss_fn=loss)
        self.pending: list[Any] = []
        self.checked, self.task_split = False, task.pipeline_split is not None

    def add(self, batch: Any, last: bool) -> torch.Tensor:
        """Hold ``batch``; on the step's last micro-batch run them all (zero until then)."""
        self.pending.append(batch)
        if not last:  # the schedule runs the step's micro-batches together, on the last
            return torch.zeros((), device=self.device)
        return self._step()

    def _step(self) -> torch.Tensor:
        """Run the step's micro-batches through the stages; the sum of their losses, sent
        from the last stage to every stage (the loop divides by the accumulation). The
        schedule runs the backward itself."""
        if not self.checked and self.task_split is False:
            why = pipeline_stages.padding_refused(self.pending[0])
            if why:
                raise ValueError(why)
        self.checked = True
        inputs = torch.cat([pipeline_stages.input_ids(b) for b in self.pending]).to(self.device)
        target = torch.cat([pipeline_stages.target_ids(b) for b in self.pending]).to(self.device)
        self.pending = []
        losses: list[torch.Tensor] = []
        stage = self.layout.coordinates(dist.get_rank())[0]
        if stage == 0:
            self.clock.step(self.schedule.step, inputs, target=target, losses=losses)
        else:
            self.clock.step(self.schedule.step, target=target, losses=losses)
        total = torch.stack([x.detach().float() for x in losses]).sum() if losses \
            else torch.zeros((), device=self.device)
        dist.broadcast(total, group=self.mesh["pp"].get_group(), group_src=self.layout.pp - 1)
        return total

    def sum_tied(self) -> None:
        """A tied embedding's two copies (first stage: its input, last: its output) get the
        sum of their gradients, so they stay the one parameter the whole model has."""
        if not self.tied:
            return
        group = _ends_group(self.layout, dist.get_rank())
        parts = [dict(part.named_parameters()) for part in self.parts]
        for i, name in self.tied:
            grad = parts[i][name].grad
            if grad is not None:
                dist.all_reduce(_local(grad), group=group)

    def close(self) -> None:
        self.parts, self.schedule, self.pending = [], None, []
