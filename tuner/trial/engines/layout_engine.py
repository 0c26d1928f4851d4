"""The parallel layout: tensor and pipeline parallelism, with FSDP2 or replication on the
data-parallel dimension, composed as torchtitan composes them (issue 27).

The model arrives prepared by :func:`tuner.trial.engines.parallelize.parallelize`, as every
engine's does: tensor parallelism, the pipeline split (this rank's stage, or two under the
interleaved schedule), checkpointing and compile on the blocks, then FSDP2 or its
``replicate`` over the ``dp`` sub-mesh of one ``(pp, dp, tp)`` ``DeviceMesh``
(:mod:`tuner.config.layout`). This engine runs its steps:

- Without stages each micro-batch is the task's ``compute_loss`` as in the other
  engines; with stages, the micro-batches of one optimizer step are gathered and run by
  PyTorch's schedule (``accumulation`` micro-batches per pipeline step), and the last
  stage's loss is sent to the others, so every rank records the same curve. Each
  pipeline step is timed with the stages' work inside it: the bubble share
  (:mod:`tuner.trial.engines.pipeline_clock`).
- A tied embedding's two copies (first and last stage) get the sum of their gradients.

fp16 is refused for these layouts (:func:`tuner.config.layout.refusal`); bf16 is FSDP2's
``MixedPrecisionPolicy`` when sharded, autocast otherwise.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import nn

from tuner.config import layout as layouts
from tuner.trial import pipeline_parallel
from tuner.trial.engines import data_parallel
from tuner.trial.engines.base import OwnLoopEngine, autocast
from tuner.trial.engines.fsdp_engine import FSDP_COLLECTIVES
from tuner.trial.engines.parallelize import Parallelized
from tuner.trial.engines.pipeline_clock import PipelineClock

if TYPE_CHECKING:
    from tuner.config.space import Config
    from tuner.config.task import Task
    from tuner.harness.comm import CommTimer

FUNCTIONAL = ("all_reduce", "reduce_scatter_tensor", "all_gather_tensor", "wait_tensor")
"""The functional collectives DTensor's redistributions call (torch 2.13), and their wait."""


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


class LayoutEngine(OwnLoopEngine):
    def __init__(self, prepared: Parallelized, task: "Task",
                 make_optimizer: Callable[[Any], torch.optim.Optimizer], config: "Config",
                 device: torch.device) -> None:
        super().__init__(config, device)
        self.layout, self.mesh, self.parts = prepared.layout, prepared.mesh, prepared.parts
        lay = self.layout
        self.compute_loss, self.scaler = task.compute_loss, None
        self.recompute, self.notes, self.after_step = prepared.recompute, prepared.notes, prepared.after_step
        self.tied, self.loss_parallel = prepared.tied, prepared.loss_parallel
        self.model: Any = prepared.model
        self.optimizer = make_optimizer(prepared.parameters())
        self.clock = PipelineClock(device)
        """Each pipeline step and the stages' work inside it: the bubble (:mod:`.pipeline_clock`)."""
        self.schedule = self._schedule(self.parts, prepared.indices, prepared.stages, task) if lay.pp > 1 else None
        self.pending: list[Any] = []
        self.checked, self.task_split = False, task.pipeline_split is not None
        self.notes.append(f"layout: tensor_parallel {lay.tp}" + (" (sequence parallel)" if config.sequence_parallel
                                                                   else "")
                          + f" x pipeline_parallel {lay.pp} x data-parallel {lay.dp}"
                          + (f" ({config.pipeline_schedule}, {config.grad_accum_steps} micro-batches per pipeline "
                             "step)" if lay.pp > 1 else ""))

    def _schedule(self, parts: list[nn.Module], indices: list[int], count: int, task: "Task") -> Any:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        group = self.mesh["pp"].get_group()
        stages = [PipelineStage(part, i, count, self.device, group=group) for part, i in zip(parts, indices)]
        for stage in stages:
            self.clock.watch(stage)
        loss = task.pipeline_loss or pipeline_parallel.next_token_loss
        accum = self.config.grad_accum_steps
        if self.config.pipeline_schedule == "interleaved_1f1b":
            return ScheduleInterleaved1F1B(stages, n_microbatches=accum, loss_fn=loss)
        cls = ScheduleGPipe if self.config.pipeline_schedule == "gpipe" else Schedule1F1B
        return cls(stages[0], n_microbatches=accum, loss_fn=loss)

    # --- a step ---------------------------------------------------------------------------

    def forward(self, batch: Any, last: bool) -> torch.Tensor:
        data_parallel.set_sync(self.parts, last)
        if self.schedule is None:
            return self._loss(batch)
        self.pending.append(batch)
        if not last:  # the schedule runs the step's micro-batches together, on the last
            return torch.zeros((), device=self.device)
        return self._pipeline_step()

    def _loss(self, batch: Any) -> torch.Tensor:
        """The task's loss; vocabulary-parallel where the head's logits stay sharded, gathered
        (once, for the rest of the trial) where the task's code cannot take them."""
        lp = self.loss_parallel
        if lp is None or not lp.on:
            with autocast(self.device, self.config.amp_dtype):
                return self.compute_loss(self.model, batch)
        try:
            with lp.context(), autocast(self.device, self.config.amp_dtype):
                return lp.local(self.compute_loss(self.model, batch))
        except torch.OutOfMemoryError:
            raise
        except (NotImplementedError, RuntimeError, TypeError, ValueError, AttributeError, AssertionError) as exc:
            self.notes.append(lp.fall_back(exc))
            return self._loss(batch)

    def _pipeline_step(self) -> torch.Tensor:
        """Run the step's micro-batches through the stages; the sum of their losses, sent
        from the last stage to every stage (the loop divides by the accumulation)."""
        if not self.checked and self.task_split is False:
            why = pipeline_parallel.padding_refused(self.pending[0])
            if why:
                raise ValueError(why)
        self.checked = True
        inputs = torch.cat([pipeline_parallel.input_ids(b) for b in self.pending]).to(self.device)
        target = torch.cat([pipeline_parallel.target_ids(b) for b in self.pending]).to(self.device)
        self.pending = []
        losses: list[torch.Tensor] = []
        stage = self.layout.coordinates(dist.get_rank())[0]
        assert self.schedule is not None
        with autocast(self.device, self.config.amp_dtype):
            if stage == 0:
                self.clock.step(self.schedule.step, inputs, target=target, losses=losses)
            else:
                self.clock.step(self.schedule.step, target=target, losses=losses)
        total = torch.stack([x.detach().float() for x in losses]).sum() if losses \
            else torch.zeros((), device=self.device)
        dist.broadcast(total, group=self.mesh["pp"].get_group(), group_src=self.layout.pp - 1)
        return total

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        if self.schedule is not None:  # the schedule ran its own backward
            return
        if self.loss_parallel is not None and self.loss_parallel.on:
            with self.loss_parallel.context():  # the cross-entropy's backward needs it too
                super().backward(loss, last)
        else:
            super().backward(loss, last)

    def optimizer_step(self) -> None:
        if self.tied:
            self._sum_tied()
        super().optimizer_step()

    def _sum_tied(self) -> None:
        """A tied embedding's two copies (first stage: its input, last: its output) get the
        sum of their gradients, so they stay the one parameter the whole model has."""
        group = _ends_group(self.layout, dist.get_rank())
        parts = [dict(part.named_parameters()) for part in self.parts]
        for i, name in self.tied:
            grad = parts[i][name].grad
            if grad is not None:
                dist.all_reduce(_local(grad), group=group)

    def time_collectives(self, timer: "CommTimer") -> ContextManager[Any]:
        """On CPU/gloo, the host time of the collectives: FSDP2's (sharded or replicated:
        ``torch.distributed``), GPT-2's hand-made tensor-parallel ones (the same), and
        DTensor's tensor-parallel ones, which it issues through the functional collectives
        (``torch.distributed._functional_collectives``: the call, then ``wait_tensor`` where
        the result is first used). Not the stages' sends and receives (``P2POp`` accepts
        only ``dist.isend`` / ``dist.irecv`` themselves, so they cannot be wrapped): the
        bubble share holds them. On a GPU the profiled window counts all of it, from the
        kernels."""
        if self.device.type != "cpu":
            return contextlib.nullcontext()
        import torch.distributed._functional_collectives as funcol

        stack = contextlib.ExitStack()
        stack.enter_context(timer.patched(dist, FSDP_COLLECTIVES))
        stack.enter_context(timer.patched(funcol, FUNCTIONAL))
        return stack

    def close(self) -> None:
        super().close()
        self.parts, self.schedule, self.pending = [], None, []
