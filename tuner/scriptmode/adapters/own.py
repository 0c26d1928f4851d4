"""The script's own configuration, read from its library before the search measures anything.

The baseline is what the user runs. The search first runs the script with a trial file
saying ``"look": true``: nothing is applied, and the hooks below read what the script sets
where its library decides it, report it and end the run: ``hf`` its validated
``TrainingArguments`` (the model never loads), ``accelerate`` the ``Accelerator`` and the
first prepared DataLoader, ``deepspeed`` the config given to ``deepspeed.initialize``,
``lightning`` the Trainer's precision, accumulation and strategy, ``torch`` the DataLoader
that fed the first optimizer step, its micro-batches until the second and any autocast.
Without it a script's own batch would be measured as the recipe's. What a library does not
say is left out, never guessed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tuner.inputs.levers import LEVERS
from tuner.inputs.script import LOADER_KNOBS
from tuner.scriptmode import trialfile
from tuner.scriptmode.adapters.common import own_value

AMP = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
"""An autocast dtype as ``amp_dtype``."""


class Look:
    """What has been read so far, with where each value came from; reported once."""

    def __init__(self, trial: dict[str, Any]) -> None:
        self.trial = trial
        self.values: dict[str, Any] = {}
        self.where: dict[str, str] = {}
        self.notes: list[str] = []
        self.done = False

    def saw(self, source: str, **values: Any) -> None:
        for name, value in values.items():
            if value is not None and name not in self.values:
                self.values[name], self.where[name] = value, source

    def report(self) -> None:
        """Write what was read (rank 0) and end this process: the launcher ends the others."""
        if self.done:
            return
        self.done = True
        trialfile.write_own({"values": self.values, "where": self.where, "notes": self.notes}, self.trial)
        if int(os.environ.get("RANK", "0")) == 0:
            os._exit(0)


def loader_values(loader: Any) -> dict[str, Any]:
    """A DataLoader's batch size and loader levers (the DataLoader's defaults where unset)."""
    out: dict[str, Any] = {"micro_batch_size": loader.batch_size,
                           **{name: own_value(loader, name) for name in LOADER_KNOBS}}
    if out["num_workers"] == 0:  # meaningless without workers: the levers' own defaults
        out.update({name: LEVERS[name].default for name in LOADER_KNOBS if name != "num_workers"})
    return out


def zero_stage(config: Any) -> int | None:
    """The ZeRO stage of a DeepSpeed config (a dict or a JSON file's path); ``None``: unreadable."""
    if config is None:
        return 0
    config = _config_dict(config)
    if config is None:
        return None
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    return int(stage) if isinstance(stage, int) or str(stage).isdigit() else None


def _config_dict(config: Any) -> dict[str, Any] | None:
    """A DeepSpeed config given as a dict or a JSON file's path, as a dict (``None``: neither, or unreadable)."""
    if isinstance(config, (str, os.PathLike)):
        try:
            config = json.loads(Path(config).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    return config if isinstance(config, dict) else None


def amp_of(bf16: Any, fp16: Any) -> str:
    return "bf16" if _on(bf16) else "fp16" if _on(fp16) else "fp32"


def _on(section: Any) -> bool:
    """A bf16/fp16 flag or DeepSpeed section (``{"enabled": true}``) that is on."""
    if isinstance(section, dict):
        return section.get("enabled") is True
    return section is True


def install(mode: str, trial: dict[str, Any]) -> None:
    look = Look(trial)
    {"hf": _hf, "accelerate": _accelerate, "deepspeed": _deepspeed, "lightning": _lightning,
     "torch": _torch}[mode](look)


def _hf(look: Look) -> None:
    import transformers

    cls = transformers.TrainingArguments
    original = cls.__post_init__

    def __post_init__(self: Any) -> None:
        original(self)
        workers = int(self.dataloader_num_workers or 0)
        look.saw("TrainingArguments", micro_batch_size=self.per_device_train_batch_size,
                 grad_accum_steps=self.gradient_accumulation_steps, amp_dtype=amp_of(self.bf16, self.fp16),
                 num_workers=workers, pin_memory=bool(self.dataloader_pin_memory),
                 zero_stage=zero_stage(self.deepspeed), compile=bool(self.torch_compile),
                 activation_checkpointing="full" if self.gradient_checkpointing else "none")
        if workers:
            look.saw("TrainingArguments", persistent_workers=bool(self.dataloader_persistent_workers),
                     prefetch_factor=self.dataloader_prefetch_factor)
        if self.tf32 is not None:
            look.saw("TrainingArguments", matmul_precision="high" if self.tf32 else "highest")
        look.report()

    cls.__post_init__ = __post_init__  # type: ignore[method-assign]


def _accelerate(look: Look) -> None:
    import accelerate
    from torch.utils.data import DataLoader

    cls = accelerate.Accelerator
    original_init, original_prepare = cls.__init__, cls.prepare

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        amp = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}.get(str(self.mixed_precision))
        look.saw("Accelerator", amp_dtype=amp, grad_accum_steps=self.gradient_accumulation_steps)

    def prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        loader = next((a for a in args if isinstance(a, DataLoader)), None)
        if loader is not None and loader.batch_size is not None:
            look.saw("the DataLoader given to accelerator.prepare", **loader_values(loader))
            look.report()
        return original_prepare(self, *args, **kwargs)

    cls.__init__, cls.prepare = __init__, prepare  # type: ignore[method-assign]


def _deepspeed(look: Look) -> None:
    import deepspeed
    from torch.utils.data import DataLoader

    original_initialize, original_iter = deepspeed.initialize, DataLoader.__iter__
    state: dict[str, Any] = {"initialized": False}

    def initialize(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("config") or kwargs.get("config_params")
        ns = kwargs.get("args", args[0] if args else None)
        if config is None and getattr(ns, "deepspeed_config", None):
            config = ns.deepspeed_config
        config = _config_dict(config)
        if config is not None:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            micro, accum = config.get("train_micro_batch_size_per_gpu"), config.get("gradient_accumulation_steps")
            total = config.get("train_batch_size")
            if micro is None and isinstance(total, int) and isinstance(accum, int):
                micro = total // (accum * world)
            if accum is None and isinstance(total, int) and isinstance(micro, int):
                accum = total // (micro * world)
            look.saw("the DeepSpeed config", micro_batch_size=micro if isinstance(micro, int) else None,
                     grad_accum_steps=accum if isinstance(accum, int) else 1 if micro is not None else None,
                     amp_dtype=amp_of(config.get("bf16"), config.get("fp16")), zero_stage=zero_stage(config))
        state["initialized"] = True
        return original_initialize(*args, **kwargs)

    def __iter__(self: Any) -> Any:
        if state["initialized"] and self.batch_size is not None:
            loader = loader_values(self)
            loader.pop("micro_batch_size")  # the engine's config decides the micro-batch
            look.saw("the first DataLoader iterated after deepspeed.initialize", **loader)
            look.report()
        return original_iter(self)

    deepspeed.initialize = initialize
    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]


def _lightning(look: Look) -> None:
    import importlib
    import importlib.util

    for name in ("lightning.pytorch", "pytorch_lightning"):
        if importlib.util.find_spec(name.split(".")[0]) is None:
            continue
        cls = importlib.import_module(name).Trainer
        cls.__init__ = _trainer_init(cls.__init__, look)
    _torch(look, accumulation=False)


def _trainer_init(original: Any, look: Look) -> Any:
    import functools

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        precision = str(getattr(self, "precision", "32-true"))
        amp = "bf16" if precision.startswith("bf16") else "fp16" if precision.startswith("16") else "fp32"
        strategy = getattr(self, "strategy", None)
        config = getattr(strategy, "config", None) if type(strategy).__name__ == "DeepSpeedStrategy" else None
        look.saw("the Lightning Trainer", amp_dtype=amp, grad_accum_steps=int(self.accumulate_grad_batches),
                 zero_stage=zero_stage(config) if config is not None else 0)

    return __init__


def _torch(look: Look, accumulation: bool = True) -> None:
    """The loader that fed the first optimizer step, its batches until the second, and the
    autocast entered in between."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader

    original_iter, original_enter = DataLoader.__iter__, torch.autocast.__enter__
    state: dict[str, Any] = {"last": None, "training": None, "optimizer": None, "batches": 0, "amp": None}

    def __iter__(self: Any) -> Any:
        source = original_iter(self)

        def batches() -> Any:
            for batch in source:
                state["last"] = self
                if self is state["training"]:
                    state["batches"] += 1
                yield batch

        return batches()

    def __enter__(self: Any) -> Any:
        if self._enabled and state["amp"] is None:
            state["amp"] = AMP.get(str(self.fast_dtype))
        return original_enter(self)

    def stepped(optimizer: Any) -> None:
        if state["optimizer"] is None:
            state["optimizer"], state["training"] = optimizer, state["last"]
            state["amp"] = None  # what the first step ran under is all that counts from here
            if state["training"] is None:
                look.notes.append("the script iterated no torch DataLoader before its first optimizer step, so "
                                  "its micro-batch cannot be read")
                look.report()
            elif not accumulation:
                look.saw("the DataLoader that fed the first optimizer step", **loader_values(state["training"]))
                look.report()
            return
        if optimizer is not state["optimizer"]:
            return
        look.saw("the DataLoader that fed the first optimizer step", **loader_values(state["training"]))
        look.saw("the loop (micro-batches between two optimizer steps)", grad_accum_steps=max(state["batches"], 1))
        look.saw("the loop (torch.autocast between two optimizer steps)", amp_dtype=state["amp"] or "fp32")
        look.report()

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
    torch.autocast.__enter__ = __enter__  # type: ignore[method-assign]
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: stepped(optimizer))
