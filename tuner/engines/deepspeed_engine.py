"""DeepSpeed: ZeRO stages 0-3, bf16/fp16 handled by its optimizer wrappers.

DeepSpeed divides the loss by the accumulation steps itself and only steps the optimizer
at the accumulation boundary, so every micro-batch calls ``engine.step()``.
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any, Callable

import torch

from tuner.engines.base import Engine, autocast
from tuner.export import ds_config

if TYPE_CHECKING:
    from tuner.space import Config


class DeepSpeedEngine(Engine):
    def __init__(
        self,
        module: torch.nn.Module,
        make_optimizer: Callable[[Any], torch.optim.Optimizer],
        compute_loss: Callable[[Any, Any], torch.Tensor],
        config: "Config",
        device: torch.device,
        world_size: int,
    ) -> None:
        super().__init__(config, device)
        import deepspeed
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)  # its INFO lines would drown the table
        module.to(device)
        optimizer = make_optimizer(module.parameters())
        cfg = ds_config(config, world_size)
        # The user's optimizer is a torch one DeepSpeed may not list as tested for ZeRO.
        cfg["zero_allow_untested_optimizer"] = True
        cfg["steps_per_print"] = 2**31 - 1
        self.model, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=cfg)
        self.compute_loss = compute_loss

    def forward_backward(self, batch: Any, last: bool) -> torch.Tensor:
        # With bf16/fp16 DeepSpeed holds half-precision weights; autocast lets fp32
        # inputs from the user's data meet them without a cast in every task.
        with autocast(self.device, self.config.amp_dtype):
            loss = self.compute_loss(self.model, batch)
        self.model.backward(loss)
        self.model.step()
        return loss.detach()

    def optimizer_step(self) -> None:
        """Nothing left to do: the last ``engine.step()`` was the optimizer step."""

    def close(self) -> None:
        self.model.destroy()
        del self.model, self.compute_loss
        gc.collect()
