"""How a trial trains: :func:`build_engine` prepares the model once for every engine
(:func:`.parallelize.parallelize`: converters, tensor/pipeline parallelism, checkpointing,
compile, the data-parallel wrapping) and runs its steps in PyTorch's engine (one process,
DDP, FSDP2, the parallel layouts: :mod:`.torch_engine`) or DeepSpeed's, which wraps the model
itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tuner.inputs.engine import kind
from tuner.trial.engines import model_levers, stages
from tuner.trial.engines.base import Engine
from tuner.trial.engines.parallelize import parallelize

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.task import Task

__all__ = ["Engine", "build_engine", "prepare"]


def prepare(config: "Plan", device: torch.device) -> None:
    """One-time, per-process setup of the config's engine, kept out of trial timings."""
    if kind(config.engine).wraps_model:
        from tuner.trial.engines import deepspeed_engine

        deepspeed_engine.prepare(device)
    if config.compile:
        model_levers.prepare_compile(device)


def prepare_all(configs: "list[Plan]", device: torch.device) -> None:
    """What :func:`prepare` does for every configuration a search may run, before its
    first trial: then the first trial measures like the tenth, whatever comes first."""
    for config in configs:
        prepare(config, device)


def build_engine(task: "Task", task_args: dict[str, Any], config: "Plan", device: torch.device) -> Engine:
    """Build the task's model and optimizer inside the engine the config asks for."""
    module = task.build_model(task_args)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"build_model must return a torch.nn.Module, got {type(module).__name__}")

    def make_optimizer(params: Any) -> torch.optim.Optimizer:
        if task.build_optimizer is not None:
            return stages.optimizer(task.build_optimizer(params, task_args), config)
        # built with its implementation's flag: AdamW checks a fused one's devices where it is made
        built = torch.optim.AdamW(params, lr=1e-4, **model_levers.optimizer_kwargs(config.optimizer_impl))
        return stages.optimizer(built, config)

    prepared = parallelize(module, task, config, device)
    del module  # a pipeline stage keeps only its own blocks
    if kind(config.engine).wraps_model:
        from tuner.trial.engines.deepspeed_engine import DeepSpeedEngine

        engine: Engine = DeepSpeedEngine(prepared.model, make_optimizer, task.compute_loss, config, device)
        engine.recompute, engine.notes, engine.after_step = prepared.recompute, prepared.notes, prepared.after_step
        return engine
    from tuner.trial.engines.torch_engine import TorchEngine

    pipeline = None
    if prepared.layout.pp > 1:
        from tuner.trial.engines.pipeline_steps import PipelineSteps

        pipeline = PipelineSteps(prepared, task, config, device)
    return TorchEngine(prepared, task.compute_loss, make_optimizer, config, device, pipeline)
