"""Plain PyTorch: one process as is, several ranks with DistributedDataParallel."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from tuner.trial.engines.base import OwnLoopEngine, autocast

if TYPE_CHECKING:
    from tuner.config.space import Config
    from tuner.harness.comm import CommTimer


class TorchEngine(OwnLoopEngine):
    """Autocast forward, loss scaled by 1/accumulation, ``no_sync`` until the last micro-batch.

    fp16 uses a ``GradScaler`` (loss scaling); bf16 and fp32 need none.
    """

    def __init__(
        self,
        model: Any,
        make_optimizer: Callable[[Any], torch.optim.Optimizer],
        compute_loss: Callable[[Any, Any], torch.Tensor],
        config: "Config",
        device: torch.device,
    ) -> None:
        """``model``: the module, or DDP's wrapper of it over several ranks
        (:func:`tuner.trial.engines.parallelize.parallelize`)."""
        super().__init__(config, device)
        self.distributed = isinstance(model, DDP)
        self.model: Any = model
        self.optimizer = make_optimizer(model.parameters())  # DDP yields its module's own parameters
        self.compute_loss = compute_loss
        self.scaler = torch.amp.GradScaler(device.type) if config.amp_dtype == "fp16" else None
        self._timed = False

    def time_collectives(self, timer: "CommTimer") -> ContextManager[Any]:
        """DDP's all-reduces start in C++: a communication hook (attached once) times them."""
        if self.distributed and self.device.type == "cpu" and not self._timed:
            timer.attach_ddp(self.model)
            self._timed = True
        return contextlib.nullcontext()

    def forward(self, batch: Any, last: bool) -> torch.Tensor:
        if self.distributed:
            # What DDP.no_sync() sets, spanning forward and backward without a context
            # manager: gradients are all-reduced only on the last micro-batch.
            self.model.require_backward_grad_sync = last
        with autocast(self.device, self.config.amp_dtype):
            return self.compute_loss(self.model, batch)
