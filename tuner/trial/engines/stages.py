"""The levers a trial applies at a stage, in one pass over the registry each (the stages of
:class:`tuner.config.lever.Stage` that no engine names a lever for): the contexts around
each forward (``forward``: the attention kernel), and the model converters run before the
engine wraps the model (``convert``: low-precision layers, a fused loss), which may hand back what
must run after each optimizer step. A lever of such a stage is its declaration and its
function; nothing here names it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from tuner.config.levers import LEVERS
from tuner.trial.engines.process import resolve

if TYPE_CHECKING:
    from tuner.config.space import Config


@contextlib.contextmanager
def forward(config: "Config") -> Iterator[None]:
    """Every ``forward`` lever's context, entered in declaration order when this is (not
    when it is made: the recompute of a checkpointed block makes it in the forward and
    enters it in the backward)."""
    with contextlib.ExitStack() as stack:
        for lever in LEVERS.values():
            if lever.stage == "forward":
                stack.enter_context(resolve(lever.apply)(config))
        yield


def convert(module: torch.nn.Module, config: "Config") -> list[Callable[[], None]]:
    """Every ``convert`` lever applied to ``module``, in declaration order; returns what
    must run after each optimizer step."""
    after: list[Callable[[], None]] = []
    for lever in LEVERS.values():
        if lever.stage == "convert":
            after += resolve(lever.apply)(module, config)
    return after
