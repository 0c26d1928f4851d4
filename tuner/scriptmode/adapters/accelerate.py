"""``adapt: accelerate``: an Accelerate script with no tuner code.

Mixed precision and gradient accumulation through ``ACCELERATE_MIXED_PRECISION`` and
``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` (set by the launcher, as ``accelerate launch``
sets them); the first ``DataLoader`` passed to ``accelerator.prepare`` rebuilt with the
trial's micro-batch and loader knobs (dataset, sampling order, collate function and
``drop_last`` kept); a :class:`tuner.Probe` times that loader's ``next()`` as data wait
and counts an optimizer step when Accelerate really stepped (``sync_gradients``); it
watches the DDP model ``prepare`` returns (exposed all-reduce time).
"""

from __future__ import annotations

from typing import Any

from tuner.inputs.levers.precision import ACCELERATE_MIXED_PRECISION
from tuner.scriptmode.adapters.common import AdaptError, patch_method, rebuild_loader, watch_ddp
from tuner.scriptmode.config import TrialConfig


def environment(knobs: dict[str, Any], global_batch: int, world: int) -> dict[str, str]:
    """The variables the launcher sets for a trial (Accelerate reads them)."""
    accum = global_batch // (int(knobs["micro_batch_size"]) * world)
    return {"ACCELERATE_MIXED_PRECISION": ACCELERATE_MIXED_PRECISION[knobs["amp_dtype"]],
            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": str(accum)}


def install(cfg: TrialConfig, trial: dict[str, Any]) -> None:
    """Wrap ``Accelerator.__init__`` (check what it took) and ``Accelerator.prepare``
    (rebuild and measure the loader, count real optimizer steps)."""
    import accelerate
    import torch
    from torch.utils.data import DataLoader

    from tuner.harness.system.flops import holds_convolutions
    from tuner.scriptmode.probe import Probe

    cls = accelerate.Accelerator
    original_init, original_prepare = cls.__init__, cls.prepare
    state: dict[str, Any] = {"probe": None, "loader": False}

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if self.mixed_precision != ACCELERATE_MIXED_PRECISION[cfg.amp_dtype]:
            raise AdaptError(
                f"tuner (adapt: accelerate): the trial runs amp_dtype={cfg.amp_dtype} (mixed_precision="
                f"{ACCELERATE_MIXED_PRECISION[cfg.amp_dtype]!r} through ACCELERATE_MIXED_PRECISION), "
                "but the script's Accelerator has "
                f"mixed_precision={self.mixed_precision!r}: it passes mixed_precision itself, which wins over the "
                "environment. Drop that argument (accelerate launch sets it the same way), or fix amp_dtype "
                "in the recipe's space")
        if self.gradient_accumulation_steps != cfg.grad_accum_steps:
            raise AdaptError(
                f"tuner (adapt: accelerate): the trial needs {cfg.grad_accum_steps} gradient accumulation steps "
                f"(ACCELERATE_GRADIENT_ACCUMULATION_STEPS), but the script's Accelerator has "
                f"{self.gradient_accumulation_steps}: it passes a GradientAccumulationPlugin itself. Pass "
                "gradient_accumulation_steps through the environment instead, or fix micro_batch_size")
        if state["probe"] is None:  # on the device Accelerate chose: CUDA events, peak memory, MFU there
            state["probe"] = Probe(device=self.device, amp_dtype=cfg.amp_dtype)

    def prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe = state["probe"]
        args = list(args)
        train_at = None
        if not state["loader"]:
            train_at = next((i for i, a in enumerate(args) if isinstance(a, DataLoader)), None)
            if train_at is not None:
                args[train_at] = rebuild_loader(args[train_at], cfg)
                state["loader"] = True
        out = original_prepare(self, *args, **kwargs)
        results = list(out) if isinstance(out, tuple) else [out]
        for i, obj in enumerate(results):
            if isinstance(obj, torch.nn.Module) and "model" not in probe.ran:  # for advice only some models take
                probe.ran["model"] = {"convolutions": holds_convolutions(obj)}
            if i == train_at:
                _measure_loader(obj, probe)
            elif isinstance(obj, accelerate.optimizer.AcceleratedOptimizer):
                _count_steps(obj, probe, state)
            else:
                watch_ddp(obj, probe)
        return out

    cls.__init__, cls.prepare = __init__, prepare  # type: ignore[method-assign]


def _measure_loader(loader: Any, probe: Any) -> None:
    """This one loader's iterations go through the probe (timed ``next()``)."""
    patch_method(loader, "__iter__", lambda original, self: probe.loader(original(self)))


def _count_steps(optimizer: Any, probe: Any, state: dict[str, Any]) -> None:
    """A probe step each time Accelerate really stepped (not an accumulation micro-step)."""

    def step(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if self.gradient_state.sync_gradients:
            if not state["loader"]:
                raise AdaptError("tuner (adapt: accelerate): the script stepped its optimizer but never passed a "
                                 "DataLoader through accelerator.prepare, so the trial's loader knobs and "
                                 "micro-batch were not applied; prepare the training DataLoader with the model")
            probe.step()
        return out

    patch_method(optimizer, "step", step)
