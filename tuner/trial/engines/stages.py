"""The levers a trial applies at a stage, in one pass over the registry each (the stages of
:class:`tuner.inputs.lever.Stage` that no engine names a lever for): the contexts around
each forward (``forward``: autocast, the attention kernel), the model converters run before the
engine wraps the model (``convert``: low-precision layers, a fused loss), which may hand back what
must run after each optimizer step, what each part of the model this rank keeps gets on
its blocks (``model``: checkpointing, compile, the memory format), and what the optimizer
gets once built (``optimizer``: its implementation). A lever of such a stage is
its declaration and its function; nothing here names it. Levers that share a function
(``compile`` and its mode) are applied by it once, where the first is declared."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

import torch

from tuner.inputs.levers import LEVERS
from tuner.trial.engines.process import resolve

if TYPE_CHECKING:
    from tuner.inputs.space import Config


@contextlib.contextmanager
def forward(config: "Config", device: torch.device) -> Iterator[None]:
    """Every ``forward`` lever's context (``(config, device)`` -> a context manager: autocast,
    the attention kernel), entered in declaration order when this is (not when it is made:
    the recompute of a checkpointed block makes it in the forward and enters it in the
    backward). A pipeline schedule runs its stages' backward inside it too."""
    with contextlib.ExitStack() as stack:
        for lever in LEVERS.values():
            if lever.applied.stage == "forward":
                stack.enter_context(resolve(lever.applied.function)(config, device))
        yield


def convert(module: torch.nn.Module, config: "Config") -> list[Callable[[], None]]:
    """Every ``convert`` lever applied to ``module``, in declaration order; returns what
    must run after each optimizer step."""
    after: list[Callable[[], None]] = []
    for lever in LEVERS.values():
        if lever.applied.stage == "convert":
            after += resolve(lever.applied.function)(module, config)
    return after



@dataclass
class Part:
    """What a ``model`` lever's function gets: one part of the model this rank keeps (the
    whole model, or a pipeline stage), its repeated blocks, the configuration, the timer of
    checkpointed blocks' recompute (:class:`.model_levers.Recompute`), the device."""

    module: torch.nn.Module
    blocks: list[torch.nn.Module]
    config: "Config"
    recompute: Any
    device: torch.device

    def forward(self) -> ContextManager[None]:
        """The forward levers' contexts (entered again around a checkpointed block's recompute)."""
        return forward(self.config, self.device)


def batch_checks(config: "Config") -> list[Callable[[Any], None]]:
    """What the loop runs on each micro-batch before its forward, from every lever that
    declares a check (``Applied.each_batch``) and needs one in this configuration."""
    checks = []
    for make in dict.fromkeys(lever.applied.each_batch for lever in LEVERS.values() if lever.applied.each_batch):
        check = resolve(make)(config)
        if check is not None:
            checks.append(check)
    return checks


def optimizer(opt: torch.optim.Optimizer, config: "Config") -> torch.optim.Optimizer:
    """Every ``optimizer`` lever applied to the optimizer the task (or the trial) built, in
    declaration order: each returns the optimizer to use."""
    for lever in LEVERS.values():
        if lever.applied.stage == "optimizer":
            opt = resolve(lever.applied.function)(opt, config)
    return opt


def model(part: Part) -> list[str]:
    """Every ``model`` lever applied to one part, in declaration order (checkpointing, then
    compile: torchtitan's order, before the data-parallel wrapper); returns their notes."""
    notes: list[str] = []
    for apply in dict.fromkeys(lever.applied.function for lever in LEVERS.values() if lever.applied.stage == "model"):
        notes += resolve(apply)(part)
    return notes
