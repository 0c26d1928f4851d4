"""What a trial trains with: the common shape of the plain/DDP and DeepSpeed engines.

One optimizer step is ``grad_accum_steps`` micro-batches, each a :meth:`Engine.forward`
then a :meth:`Engine.backward` (the last with ``last=True``), and one
:meth:`Engine.optimizer_step`. Forward and backward are separate so that the ranks can
agree on a failure (an out-of-memory forward on one rank) before any of them enters the
backward's collectives. Losses stay on the device: reading them would synchronise the
device inside the measured loop.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch

from tuner.trial.engines import stages

if TYPE_CHECKING:
    from tuner.harness.comm import CommTimer
    from tuner.inputs.plan import Plan
    from tuner.trial.engines.model_levers import Recompute

class Engine(ABC):
    """A model, its optimizer and how a micro-batch turns into gradients."""

    model: Any
    """What the task's ``compute_loss`` receives (the wrapped module)."""
    recompute: "Recompute | None" = None
    """Times the checkpointed blocks' recompute (set by :func:`build_engine`)."""
    pipeline: Any = None
    """This rank's pipeline stages and their schedule (:mod:`.pipeline_steps`), where the
    layout has them: the loop reads the bubble from its clock."""
    after_step: "list[Callable[[], None]]"
    """What the model converters need after each optimizer step (low-precision scales under
    FSDP2), in order."""
    notes: list[str]
    """What a trial should say about how the engine was built (the blocks it used)."""
    quiet_until_last = False
    """No collective runs before the last micro-batch's backward (DDP with its sync off, no
    buffers to broadcast, no layout): ranks then agree on failures once a step, at the last
    micro-batch's forward, instead of every micro-batch (a host barrier the job does not have)."""

    def __init__(self, config: "Plan", device: torch.device) -> None:
        self.config = config
        self.device = device
        self.notes = []
        self.after_step = []
        self._compiled_before: Any = None
        if config.compile:
            from tuner.trial.engines.model_levers import compiled_so_far

            self._compiled_before = compiled_so_far()

    @abstractmethod
    def forward(self, batch: Any, last: bool) -> torch.Tensor:
        """The loss of one micro-batch; ``last`` marks the one that closes the accumulation."""

    @abstractmethod
    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Gradients of ``loss``, accumulated; synchronised across ranks when ``last``."""

    def forward_backward(self, batch: Any, last: bool) -> torch.Tensor:
        """Both halves, for a caller with nothing to agree on in between; the forward under
        the ``forward`` levers' contexts, as the trial's loop runs it."""
        with stages.forward(self.config, self.device):
            loss = self.forward(batch, last)
        self.backward(loss, last)
        return loss.detach()

    @abstractmethod
    def optimizer_step(self) -> None:
        """Apply the accumulated gradients."""

    def time_collectives(self, timer: "CommTimer") -> ContextManager[Any]:
        """While the returned context is open, the engine's collectives report their
        exposed host time to ``timer`` (CPU/gloo only: on a GPU host time says nothing
        about NCCL kernels, and the trial profiles them instead)."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Release everything the engine holds, so the next trial starts clean."""
        self._release()
        if self.config.compile:
            from tuner.trial.engines.model_levers import release_compiled

            release_compiled(self._compiled_before)
        self.recompute, self.after_step = None, []

    @abstractmethod
    def _release(self) -> None:
        """The engine's own part of :meth:`close`."""


class OwnLoopEngine(Engine):
    """An engine whose accumulation, loss scaling and optimizer step the tuner runs itself
    (plain/DDP and FSDP2; DeepSpeed does its own): the loss is divided by the accumulation
    steps, fp16 scaled by :attr:`scaler`, the optimizer stepped and its gradients freed."""

    optimizer: torch.optim.Optimizer
    scaler: Any = None
    """A ``GradScaler`` (or FSDP2's ``ShardedGradScaler``) for fp16; ``None`` otherwise."""
    compute_loss: Any

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        scaled = loss / self.config.grad_accum_steps
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        scaled.backward()

    def optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for after in self.after_step:
            after()

    def _release(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer.state.clear()
        del self.model, self.optimizer, self.scaler, self.compute_loss

