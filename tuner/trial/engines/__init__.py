"""How a trial trains: :func:`build_engine` picks plain/DDP or DeepSpeed for a config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tuner.trial.engines.base import Engine, autocast

if TYPE_CHECKING:
    from tuner.config.space import Config
    from tuner.config.task import Task

__all__ = ["Engine", "autocast", "build_engine", "prepare"]


def prepare(config: "Config", device: torch.device) -> None:
    """One-time, per-process setup of the config's engine, kept out of trial timings."""
    if config.engine == "deepspeed":
        from tuner.trial.engines import deepspeed_engine

        deepspeed_engine.prepare(device)


def build_engine(task: "Task", task_args: dict[str, Any], config: "Config", device: torch.device,
                 world_size: int) -> Engine:
    """Build the task's model and optimizer inside the engine the config asks for."""
    module = task.build_model(task_args)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"build_model must return a torch.nn.Module, got {type(module).__name__}")

    def make_optimizer(params: Any) -> torch.optim.Optimizer:
        if task.build_optimizer is not None:
            return task.build_optimizer(params, task_args)
        return torch.optim.AdamW(params, lr=1e-4)

    if config.engine == "deepspeed":
        from tuner.trial.engines.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine(module, make_optimizer, task.compute_loss, config, device, world_size)
    from tuner.trial.engines.torch_engine import TorchEngine

    return TorchEngine(module, make_optimizer, task.compute_loss, config, device)
