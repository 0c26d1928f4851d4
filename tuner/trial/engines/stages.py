"""The levers a trial applies at a stage, each stage's calls written out in order (the stages of
:class:`tuner.inputs.lever.Stage` that no engine applies itself): the contexts around each
forward (autocast, then the attention kernel), the model converters run before the engine
wraps the model (low-precision layers, then the fused loss), which may hand back what must run after
each optimizer step, what each part of the model this rank keeps gets on its blocks
(checkpointing, then compile, then the memory format: torchtitan's order, before the
data-parallel wrapper), what the optimizer gets once built (its implementation), and the
check each micro-batch gets (CUDA graphs' shapes). ``tests/structure/test_registry.py``
checks each lever of these stages is read here or by the function called."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from tuner.trial.engines.gpu_levers import attention_kernel, float8_model, fused_loss_model, graph_shapes
from tuner.trial.engines.model_levers import Part, autocast, checkpointing, compiling, implementation, memory_format

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan


@contextlib.contextmanager
def forward(config: "Plan", device: torch.device) -> Iterator[None]:
    """The forward levers' contexts, entered when this is (not when it is made: the recompute
    of a checkpointed block makes it in the forward and enters it in the backward). A
    pipeline schedule runs its stages' backward inside it too."""
    with autocast(config, device), attention_kernel(config, device):
        yield


def convert(module: torch.nn.Module, config: "Plan") -> list[Callable[[], None]]:
    """The converters applied to ``module``; returns what must run after each optimizer step."""
    return float8_model(module, config) + fused_loss_model(module, config)


def batch_checks(config: "Plan") -> list[Callable[[Any], None]]:
    """What the loop runs on each micro-batch before its forward, where the configuration needs it."""
    check = graph_shapes(config)
    return [check] if check is not None else []


def optimizer(opt: torch.optim.Optimizer, config: "Plan") -> torch.optim.Optimizer:
    """The optimizer levers applied to the optimizer the task (or the trial) built: the one to use."""
    return implementation(opt, config)


def model(module: torch.nn.Module, blocks: list[torch.nn.Module], config: "Plan", recompute: Any,
          device: torch.device) -> list[str]:
    """The model levers applied to one part of the model this rank keeps (the whole model, or
    a pipeline stage) and its repeated blocks; returns their notes."""
    part = Part(module, blocks, config, recompute, functools.partial(forward, config, device))
    return checkpointing(part) + compiling(part) + memory_format(part)
