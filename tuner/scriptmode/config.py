"""The user's own training script, as seen from inside it: ``tuner.config(**defaults)``.

Under the tuner (script mode), each trial runs the script with ``TUNER_TRIAL`` pointing at
a JSON file that holds the trial's knobs, the measured window and where to report; the
script reads its knobs from :func:`config` and reports through :class:`tuner.Probe`.
Without the tuner, :func:`config` returns the script's own defaults and the probe only
measures, so the same script runs unchanged in production::

    cfg = tuner.config(num_workers=2, amp_dtype="bf16", micro_batch_size=8, global_batch_size=64)
    loader = DataLoader(dataset, sampler=sampler, **cfg.dataloader_kwargs())
    engine, *_ = deepspeed.initialize(model=model, config=cfg.ds_config("ds_config.json"), ...)
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tuner.inputs import levers, library_configs
from tuner.inputs.engine import engine_of
from tuner.inputs.levers import LEVERS
from tuner.inputs.levers.precision import ACCELERATE_MIXED_PRECISION
from tuner.inputs.plan import Plan
from tuner.inputs.rules import applies
from tuner.inputs.space import defaults
from tuner.scriptmode.trialfile import read_trial


@dataclass(frozen=True)
class TrialConfig:
    """The knobs a script trains with, read by name (``cfg.amp_dtype``: every lever's, from
    the one :class:`~tuner.inputs.plan.Plan`), and the settings derived from them.
    ``tuned``: the tuner chose them (a trial), else the script's defaults; ``given``: the
    knobs the recipe sets (or the script's defaults name): only those of the levers below
    the batch and precision replace what a script's own config says."""

    config: Plan
    global_batch_size: int
    tuned: bool
    given: frozenset[str] = frozenset()

    @classmethod
    def of(cls, global_batch_size: int, world_size: int, tuned: bool, given: frozenset[str] = frozenset(),
           **knobs: Any) -> "TrialConfig":
        """From knob values (every lever not given at its default)."""
        values = defaults() | knobs
        accum = global_batch_size // (values["micro_batch_size"] * world_size)
        config = Plan.of(world_size, engine_of(values), **values, grad_accum_steps=accum)
        return cls(config, global_batch_size, tuned, given)

    def __getattr__(self, name: str) -> Any:
        if name in LEVERS:  # only a knob: copy and pickle look up their hooks here too
            return getattr(self.config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def world_size(self) -> int:
        """The ranks the script runs on."""
        return self.config.world_size

    @property
    def grad_accum_steps(self) -> int:
        """global batch / (micro-batch x world size): the global batch is held constant."""
        return self.config.grad_accum_steps

    def dataloader_kwargs(self) -> dict[str, Any]:
        """``DataLoader(dataset, sampler=..., **cfg.dataloader_kwargs())``; batch size per rank."""
        return levers.dataloader_kwargs(self.config)

    def ds_config(self, base: Mapping[str, Any] | str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """The script's DeepSpeed config (a dict, or a JSON file's path) with the tuned keys
        set: batch sizes, accumulation, ZeRO stage (its other ZeRO keys kept), bf16/fp16."""
        if base is None:
            out: dict[str, Any] = {}
        elif isinstance(base, Mapping):
            out = copy.deepcopy(dict(base))
        else:
            path = Path(base)
            try:
                out = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise ValueError(f"ds_config: cannot read {path} as a DeepSpeed JSON config: {exc}") from None
        tuned = library_configs.ds_config(self.config, cuda=_cuda())
        zero = dict(out.get("zero_optimization") or {})
        zero["stage"] = self.zero_stage
        for key, value in tuned["zero_optimization"].items():
            if key not in self.given:
                continue
            own = zero.get(key)
            # The script's own offload block keeps its keys (buffer_count, ratio, its own
            # pin_memory); the tuner sets only where to offload.
            zero[key] = {**value, **own, "device": value["device"]} if isinstance(own, Mapping) else value
        if "offload_optimizer" in self.given and self.offload_optimizer == "none":
            zero.pop("offload_optimizer", None)
        out.update({k: v for k, v in tuned.items() if k not in ("zero_optimization", "bf16", "fp16")})
        out["zero_optimization"] = zero
        for dtype in ("bf16", "fp16"):
            section = dict(out.get(dtype) or {})
            section["enabled"] = self.amp_dtype == dtype
            out[dtype] = section
        return out

    def ddp_kwargs(self) -> dict[str, Any]:
        """``DistributedDataParallel(model, **cfg.ddp_kwargs())``: its bucket size, gradients as
        views of its buckets, a static graph."""
        return library_configs.ddp_kwargs(self.config)

    def accelerate_kwargs(self) -> dict[str, Any]:
        """``Accelerator(**cfg.accelerate_kwargs())``."""
        return {"mixed_precision": ACCELERATE_MIXED_PRECISION[self.amp_dtype],
                "gradient_accumulation_steps": self.grad_accum_steps}

    def hf_training_args(self) -> dict[str, Any]:
        """``TrainingArguments(output_dir=..., **cfg.hf_training_args())``; with ZeRO, the
        DeepSpeed config is given as a dict."""
        args = library_configs.hf_training_args(self.config)
        for name, knob in library_configs.HF_LEVER_FIELDS.items():  # an untuned lever stays the script's
            if knob not in self.given:
                args.pop(name, None)
            elif name not in args and name in library_configs.HF_LEVER_OFF:
                args[name] = library_configs.HF_LEVER_OFF[name]
        if self.zero_stage > 0:
            args["deepspeed"] = self.ds_config()
        return args


def _set_process_levers(config: Plan, given: frozenset[str]) -> None:
    """Under a trial, the process-wide levers the recipe sets (TF32 matmuls, cuDNN's
    algorithm search) take the trial's values here: the script process is the trial's, and
    a script cannot forget one of them (its trials would measure the same thing twice)."""
    if any(LEVERS[name].applied.stage == "process" for name in given if name in LEVERS):
        from tuner.trial.engines.process import set_process_levers

        set_process_levers(config, only=given)


def _cuda() -> bool:
    """Whether the script trains on CUDA (offload pins its host buffers there)."""
    import torch

    return torch.cuda.is_available()


def config(global_batch_size: int | None = None, **defaults: Any) -> TrialConfig:
    """The trial's knobs under the tuner, else ``defaults`` (knobs not given take the
    tuner's defaults). Under the tuner, the process-wide levers the recipe searches
    (``matmul_precision``, ``cudnn_benchmark``) are set here too. ``global_batch_size``
    defaults to micro-batch x world size (no accumulation) when the script does not say."""
    unknown = sorted(set(defaults) - set(LEVERS))
    if unknown:
        raise TypeError(f"tuner.config(): unknown knob(s) {', '.join(unknown)}; knobs are {', '.join(LEVERS)}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trial = read_trial()
    tuned = trial is not None
    given = frozenset(trial.get("given", LEVERS) if trial is not None else defaults)
    values = {name: knob.default for name, knob in LEVERS.items()}
    values.update(defaults)
    if trial is not None:
        values.update(trial.get("knobs", {}))
        global_batch_size = trial.get("global_batch_size", global_batch_size)
    if values["micro_batch_size"] is None:
        values["micro_batch_size"] = (global_batch_size // world) if global_batch_size else 1
    if global_batch_size is None:
        global_batch_size = values["micro_batch_size"] * world
    if global_batch_size % (values["micro_batch_size"] * world):
        raise ValueError(f"tuner.config(): global_batch_size {global_batch_size} is not divisible by "
                         f"micro_batch_size {values['micro_batch_size']} x world size {world}")
    for name, lever in LEVERS.items():  # a loader lever without workers: the DataLoader refuses it
        if lever.group == "loader" and not applies(name, values, world):
            values[name] = lever.default
    try:
        cfg = TrialConfig.of(global_batch_size, world, tuned, given, **values)
    except ValueError as exc:  # a value the knob does not take
        raise ValueError(f"tuner.config(): {exc}") from None
    if trial is not None:
        _set_process_levers(cfg.config, given)
    return cfg
