"""``adapt: lightning``: a script that builds a Lightning ``Trainer`` (plain, or through
``LightningCLI``: the patched ``__init__`` keeps its signature), with no tuner code.

- The Trainer's own arguments carry the trial: ``precision`` (``32-true``, ``bf16-mixed``,
  ``16-mixed``), ``accumulate_grad_batches``, and with a ZeRO stage
  ``strategy="deepspeed_stage_N"``; whatever the script passed for them is replaced, in
  ``lightning.pytorch.Trainer`` and in ``pytorch_lightning.Trainer`` alike.
- The training DataLoader is rebuilt with the trial's micro-batch and loader knobs, and
  the loop is measured as ``adapt: torch`` measures it (:mod:`.torch`): steps from PyTorch's
  optimizer-step hook, data wait from the training loader's own ``next()`` (truer than a
  callback's gap between batches, which holds Lightning's bookkeeping too); the sanity
  check's validation batches are never taken for training (no optimizer step follows them).
- Never half-applied: a ``strategy`` object (not a name) while ZeRO stages are searched
  stops the trial with the reason.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

from tuner.inputs.levers.precision import LIGHTNING_PRECISION
from tuner.inputs.script import LOADER_KNOBS
from tuner.scriptmode.adapters import torch as torch_adapter
from tuner.scriptmode.adapters.common import AdaptError
from tuner.scriptmode.config import TrialConfig


def trainer_arguments(cfg: TrialConfig, kwargs: dict[str, Any], zero_searched: bool) -> dict[str, Any]:
    """The script's ``Trainer`` keyword arguments with the trial's set."""
    out = {**kwargs, "precision": LIGHTNING_PRECISION[cfg.amp_dtype], "accumulate_grad_batches": cfg.grad_accum_steps}
    if zero_searched or cfg.zero_stage > 0:
        strategy = kwargs.get("strategy", "auto")
        if not isinstance(strategy, str):
            raise AdaptError(f"tuner (adapt: lightning): the script gives the Trainer a {type(strategy).__name__} "
                             "strategy object, so the trial's ZeRO stage cannot be set; give a strategy name, or "
                             "remove zero_stage from the space")
        out["strategy"] = f"deepspeed_stage_{cfg.zero_stage}" if cfg.zero_stage > 0 else strategy
    return out


def install(cfg: TrialConfig, trial: dict[str, Any]) -> None:
    """The torch adapter's measurement with the loader rebuilt whole, and every Lightning
    ``Trainer.__init__`` given the trial's arguments."""
    torch_adapter.install(cfg, {**trial, "rebuild": ["micro_batch_size", *LOADER_KNOBS]})
    zero_searched = bool(trial.get("zero_searched"))
    for name in ("lightning.pytorch", "pytorch_lightning"):
        if importlib.util.find_spec(name.split(".")[0]) is None:
            continue
        trainer_cls = importlib.import_module(name).Trainer
        trainer_cls.__init__ = _with_trial(trainer_cls.__init__, cfg, zero_searched)


def _with_trial(original: Any, cfg: TrialConfig, zero_searched: bool) -> Any:
    """``Trainer.__init__`` with the trial's arguments; its signature kept (``LightningCLI``
    builds its command line from it)."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **trainer_arguments(cfg, kwargs, zero_searched))

    return __init__
