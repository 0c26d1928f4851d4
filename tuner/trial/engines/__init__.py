"""How a trial trains: :func:`build_engine` prepares the model once for every engine
(:func:`.parallelize.parallelize`: converters, tensor/pipeline parallelism, checkpointing,
compile, the data-parallel wrapping) and runs its steps in its library's engine (:data:`RUNS`):
PyTorch's (one process, DDP, FSDP2, the parallel layouts: :mod:`.torch_engine`) or
DeepSpeed's, which wraps the model itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from tuner.inputs.engine import Library, kind
from tuner.trial.engines import model_levers, stages
from tuner.trial.engines.base import Engine
from tuner.trial.engines.parallelize import Parallelized, parallelize

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.task import Task

__all__ = ["Engine", "RUNS", "build_engine", "prepare"]
MakeOptimizer = Callable[[Any], torch.optim.Optimizer]
"""Builds the optimizer over the parameters an engine hands it (the task's, with its levers)."""


def _deepspeed(prepared: Parallelized, task: "Task", make_optimizer: MakeOptimizer, config: "Plan",
               device: torch.device) -> Engine:
    from tuner.trial.engines.deepspeed_engine import DeepSpeedEngine

    engine = DeepSpeedEngine(prepared.model, make_optimizer, task.compute_loss, config, device)
    engine.recompute, engine.notes, engine.after_step = prepared.recompute, prepared.notes, prepared.after_step
    return engine


def _torch(prepared: Parallelized, task: "Task", make_optimizer: MakeOptimizer, config: "Plan",
           device: torch.device) -> Engine:
    from tuner.trial.engines.torch_engine import TorchEngine

    pipeline = None
    if prepared.layout.pp > 1:
        from tuner.trial.engines.pipeline_steps import PipelineSteps

        pipeline = PipelineSteps(prepared, task, config, device)
    return TorchEngine(prepared, task.compute_loss, make_optimizer, config, device, pipeline)


def _prepare_deepspeed(device: torch.device) -> None:
    from tuner.trial.engines import deepspeed_engine

    deepspeed_engine.prepare(device)


@dataclass(frozen=True)
class Runs:
    """How one library's engine runs a trial: its steps, built on the prepared model, and its
    one-time setup per process (``None``: none)."""

    build: Callable[[Parallelized, "Task", MakeOptimizer, "Plan", torch.device], Engine]
    prepare: Callable[[torch.device], None] | None = None


RUNS: dict[Library, Runs] = {"torch": Runs(_torch), "deepspeed": Runs(_deepspeed, _prepare_deepspeed)}
"""Each library's engine (:data:`tuner.inputs.engine.ENGINES` gives a configuration's library),
imported only when a trial runs on it: a new engine is a row here and its module."""


def prepare(config: "Plan", device: torch.device) -> None:
    """One-time, per-process setup of the config's engine, kept out of trial timings."""
    setup = RUNS[kind(config.engine).library].prepare
    if setup is not None:
        setup(device)
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
    return RUNS[kind(config.engine).library].build(prepared, task, make_optimizer, config, device)
