"""PyTorch's own training step, for every layout DeepSpeed does not run.

The model arrives prepared by :func:`tuner.trial.engines.parallelize.parallelize`: as it is
on one process, wrapped in DDP, sharded by FSDP2's ``fully_shard``, or cut by the parallel
layout (tensor parallelism, pipeline stages, FSDP2 or ``replicate`` over the data-parallel
dimension). This engine runs its steps the same way for all of them:

- Each micro-batch is the task's ``compute_loss`` (under the forward levers' autocast, entered by
  the loop: :func:`.stages.forward`), its loss divided by the
  accumulation; gradients are communicated only on the micro-batch that closes it (DDP's
  ``require_backward_grad_sync``, FSDP2's ``set_requires_gradient_sync``).
- With pipeline stages the step's micro-batches go through the schedule together
  (:mod:`tuner.trial.engines.pipeline_steps`).
- Under tensor parallelism, where the head keeps its logits sharded, the loss and its
  backward run vocabulary-parallel (:attr:`.parallelize.Parallelized.loss_parallel`).
- fp16 is scaled by a ``GradScaler`` (FSDP2's ``ShardedGradScaler`` for sharded
  parameters); bf16 and fp32 need none. fp16 is refused for the tensor and pipeline
  layouts (:mod:`tuner.inputs.rules`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tuner.trial.engines import data_parallel
from tuner.trial.engines.base import OwnLoopEngine

if TYPE_CHECKING:
    from tuner.harness.comm import CommTimer
    from tuner.inputs.plan import Plan
    from tuner.trial.engines.parallelize import Parallelized
    from tuner.trial.engines.pipeline_steps import PipelineSteps

COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce", "all_gather_into_tensor",
               "reduce_scatter_tensor")
"""``torch.distributed`` functions FSDP2 calls (by attribute, at call time) for its
all-gathers and reduce-scatters (torch 2.13's ``_fsdp_collectives``), and its ``replicate``
and GPT-2's hand-split tensor parallelism for their all-reduces."""
FUNCTIONAL = ("all_reduce", "reduce_scatter_tensor", "all_gather_tensor", "wait_tensor")
"""The functional collectives DTensor's redistributions call (torch 2.13), and their wait."""


class TorchEngine(OwnLoopEngine):
    def __init__(self, prepared: "Parallelized", compute_loss: Callable[[Any, Any], torch.Tensor],
                 make_optimizer: Callable[[Any], torch.optim.Optimizer], config: "Plan", device: torch.device,
                 pipeline: "PipelineSteps | None" = None) -> None:
        """``pipeline``: this rank's stages under their schedule, where the layout has them."""
        super().__init__(config, device)
        self.layout, self.mesh, self.parts, self.model = prepared.layout, prepared.mesh, prepared.parts, prepared.model
        self.ddp = isinstance(prepared.model, DDP)
        self.optimizer = make_optimizer(prepared.parameters())  # DDP's module's own, FSDP2's shards
        self.compute_loss = compute_loss
        self.scaler = _scaler(config, device, prepared.layout.shard)
        self.recompute, self.notes, self.after_step = prepared.recompute, prepared.notes, prepared.after_step
        self.loss_parallel, self.pipeline = prepared.loss_parallel, pipeline
        self._timed = False
        layout = prepared.layout
        self.quiet_until_last = (self.ddp and pipeline is None and layout.tp == 1 and layout.pp == 1
                                 and not (self.model.broadcast_buffers and any(True for _ in self.model.buffers())))

    # --- a step ---------------------------------------------------------------------------

    def forward(self, batch: Any, last: bool) -> torch.Tensor:
        if self.ddp:
            # What DDP.no_sync() sets, spanning forward and backward without a context
            # manager: gradients are all-reduced only on the last micro-batch.
            self.model.require_backward_grad_sync = last
        data_parallel.set_sync(self.parts, last)  # FSDP2's fully_shard and replicate
        if self.pipeline is not None:
            return self.pipeline.add(batch, last)
        return self._loss(batch)

    def _loss(self, batch: Any) -> torch.Tensor:
        """The task's loss; vocabulary-parallel where the head's logits stay sharded, gathered
        (once, for the rest of the trial) where the task's code cannot take them."""
        lp = self.loss_parallel
        if lp is None or not lp.on:
            return self.compute_loss(self.model, batch)
        try:
            with lp.context():
                return lp.local(self.compute_loss(self.model, batch))
        except torch.OutOfMemoryError:
            raise
        except (NotImplementedError, RuntimeError, TypeError, ValueError, AttributeError, AssertionError) as exc:
            self.notes.append(lp.fall_back(exc))
            return self._loss(batch)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        if self.pipeline is not None:  # the schedule ran its own backward
            return
        if self.loss_parallel is not None and self.loss_parallel.on:
            with self.loss_parallel.context():  # the cross-entropy's backward needs it too
                super().backward(loss, last)
        else:
            super().backward(loss, last)

    def optimizer_step(self) -> None:
        if self.pipeline is not None:
            self.pipeline.sum_tied()
        super().optimizer_step()

    # --- what the trial reads -------------------------------------------------------------

    def time_collectives(self, timer: "CommTimer") -> ContextManager[Any]:
        """On CPU/gloo, the host time of the collectives. DDP's all-reduces start in C++: a
        communication hook (attached once) times them. FSDP2's (sharded or replicated) and
        GPT-2's hand-made tensor-parallel ones are Python calls into ``torch.distributed``;
        DTensor's tensor-parallel ones go through the functional collectives (the call, then
        ``wait_tensor`` where the result is first used): wrapped there, each call and its
        wait. Not the stages' sends and receives (``P2POp`` accepts only ``dist.isend`` /
        ``dist.irecv`` themselves, so they cannot be wrapped): the bubble share holds them.
        On a GPU the profiled window counts all of it, from the kernels."""
        if self.device.type != "cpu" or not dist.is_initialized() or dist.get_world_size() == 1:
            return contextlib.nullcontext()
        if self.ddp:
            if not self._timed:
                timer.attach_ddp(self.model)
                self._timed = True
            return contextlib.nullcontext()
        import torch.distributed._functional_collectives as funcol

        stack = contextlib.ExitStack()
        stack.enter_context(timer.patched(dist, COLLECTIVES))
        stack.enter_context(timer.patched(funcol, FUNCTIONAL))
        return stack

    def close(self) -> None:
        super().close()
        if self.pipeline is not None:
            self.pipeline.close()
        self.parts = []


def _scaler(config: "Plan", device: torch.device, sharded: bool) -> Any:
    """fp16's loss scaler: FSDP2's sharded one where the parameters are sharded."""
    if config.amp_dtype != "fp16":
        return None
    if sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type)
