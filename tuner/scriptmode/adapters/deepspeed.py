"""``adapt: deepspeed``: a DeepSpeed script with no tuner code.

The config the script gives ``deepspeed.initialize`` (``config=``, ``config_params=`` or
``args.deepspeed_config``) gets the trial's keys set, the rest kept
(:meth:`tuner.TrialConfig.ds_config`): batch sizes, accumulation, ZeRO stage, bf16/fp16;
the first torch ``DataLoader`` the script iterates after ``initialize`` is the training
loader: rebuilt with the trial's loader knobs (its sampler kept) and measured; an
optimizer step is counted at each accumulation boundary of ``engine.step()``; the
engine's collectives are timed (``Probe.watch``).
"""

from __future__ import annotations

from typing import Any

from tuner.scriptmode.adapters.common import AdaptError, patch_method, rebuild_loader
from tuner.scriptmode.config import TrialConfig


def install(cfg: TrialConfig, trial: dict[str, Any]) -> None:
    """Wrap ``deepspeed.initialize`` (the trial's keys set into the script's config) and,
    after it, the first DataLoader the script iterates (rebuilt with the trial's loader
    knobs, measured); count an optimizer step at each accumulation boundary."""
    import deepspeed
    from torch.utils.data import DataLoader

    from tuner.scriptmode.probe import Probe

    original_initialize, original_iter = deepspeed.initialize, DataLoader.__iter__
    state: dict[str, Any] = {"probe": None, "loader": None, "rebuilt": None}

    def initialize(*args: Any, **kwargs: Any) -> Any:
        base = kwargs.pop("config", None) or kwargs.pop("config_params", None)
        ns = kwargs.get("args", args[0] if args else None)
        if base is None and getattr(ns, "deepspeed_config", None):
            base, ns.deepspeed_config = ns.deepspeed_config, None  # one config, with the trial's keys in it
        kwargs["config"] = cfg.ds_config(base)
        out = original_initialize(*args, **kwargs)
        engine = out[0]
        if state["probe"] is None:
            state["probe"] = Probe(device=engine.device, amp_dtype=cfg.amp_dtype)
            state["probe"].watch(engine)
            patch_method(engine, "step", step)
        return out

    def step(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        boundary = self.is_gradient_accumulation_boundary()  # asked before: step() moves the count on
        out = original(self, *args, **kwargs)
        if boundary:
            if state["loader"] is None:
                raise AdaptError("tuner (adapt: deepspeed): the engine stepped, but the script iterated no "
                                 "torch DataLoader after deepspeed.initialize, so the trial's loader knobs were "
                                 "not applied and data wait cannot be measured; iterate a DataLoader (or pass "
                                 "training_data to deepspeed.initialize)")
            state["probe"].step()
        return out

    def __iter__(self: Any) -> Any:
        if state["loader"] is None and state["probe"] is not None:
            state["loader"] = self  # the training loader: the first iterated after initialize
        if self is not state["loader"]:
            return original_iter(self)
        if state["rebuilt"] is None:
            state["rebuilt"] = rebuild_loader(self, cfg, "deepspeed")
        return state["probe"].loader(original_iter(state["rebuilt"]))

    deepspeed.initialize = initialize
    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
