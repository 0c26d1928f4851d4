"""What a trial trains with: the common shape of the plain/DDP and DeepSpeed engines.

One optimizer step is ``grad_accum_steps`` calls of :meth:`Engine.forward_backward`
(the last with ``last=True``) and one :meth:`Engine.optimizer_step`. Losses come back
detached and stay on the device: reading them would synchronise the device inside the
measured loop.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ContextManager

import torch

if TYPE_CHECKING:
    from tuner.space import Config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, amp_dtype: str) -> ContextManager[Any]:
    """Autocast for the forward pass; a no-op for fp32."""
    if amp_dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[amp_dtype])


class Engine(ABC):
    """A model, its optimizer and how a micro-batch turns into gradients."""

    model: Any
    """What the task's ``compute_loss`` receives (the wrapped module)."""

    def __init__(self, config: "Config", device: torch.device) -> None:
        self.config = config
        self.device = device

    @abstractmethod
    def forward_backward(self, batch: Any, last: bool) -> torch.Tensor:
        """Loss and gradients of one micro-batch; ``last`` closes the accumulation."""

    @abstractmethod
    def optimizer_step(self) -> None:
        """Apply the accumulated gradients."""

    @abstractmethod
    def close(self) -> None:
        """Release everything the engine holds, so the next trial starts clean."""
