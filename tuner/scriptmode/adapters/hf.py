"""``adapt: hf``: a script that builds a ``transformers.Trainer``, with no tuner code.

- Every ``TrainingArguments`` the script makes (directly, or through ``HfArgumentParser``)
  gets the trial's fields before it validates itself: ``per_device_train_batch_size``,
  ``gradient_accumulation_steps``, ``bf16``/``fp16``, ``dataloader_num_workers`` /
  ``_prefetch_factor`` / ``_pin_memory`` / ``_persistent_workers``, and with a ZeRO stage
  ``deepspeed`` (the script's own DeepSpeed config, if any, with the trial's keys set).
- Every ``Trainer`` gets the tuner's probe callback
  (:class:`tuner.scriptmode.callbacks.hf.ProbeCallback`): data wait from the Trainer's own
  training DataLoader, a step per optimizer step, reported when the window closes.
- Never half-applied: ``auto_find_batch_size`` (it changes the batch after an OOM) or a
  Trainer subclass with its own ``get_train_dataloader`` while loader knobs are searched
  stops the trial with the reason; any other miss is caught by the check that the second
  optimizer step took global batch / world size samples.
"""

from __future__ import annotations

from typing import Any

from tuner.scriptmode.adapters.common import AdaptError
from tuner.scriptmode.config import TrialConfig


def training_fields(cfg: TrialConfig, deepspeed: Any) -> dict[str, Any]:
    """The ``TrainingArguments`` fields a trial sets (``deepspeed``: the script's own)."""
    fields = cfg.hf_training_args()
    if cfg.num_workers == 0:  # what the script may have set for its own workers would be refused
        fields.update(dataloader_prefetch_factor=None, dataloader_persistent_workers=False)
    fields["deepspeed"] = cfg.ds_config(deepspeed) if cfg.zero_stage > 0 else deepspeed
    return fields


def install(cfg: TrialConfig, trial: dict[str, Any]) -> None:
    """Patch ``TrainingArguments.__post_init__`` (the trial's fields) and ``Trainer.__init__``
    (the checks and the probe callback)."""
    import transformers

    from tuner.scriptmode.callbacks.hf import ProbeCallback

    args_cls, trainer_cls = transformers.TrainingArguments, transformers.Trainer
    original_post_init, original_init = args_cls.__post_init__, trainer_cls.__init__
    loader_knobs_searched = bool(trial.get("searched_loader_knobs", True))

    def __post_init__(self: Any) -> None:
        if getattr(self, "auto_find_batch_size", False):
            raise AdaptError("tuner (adapt: hf): the script's TrainingArguments set auto_find_batch_size, which "
                             "changes the batch size the trial sets; drop it to tune micro_batch_size")
        for name, value in training_fields(cfg, getattr(self, "deepspeed", None)).items():
            setattr(self, name, value)
        original_post_init(self)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        own_loader = type(self).get_train_dataloader is not trainer_cls.get_train_dataloader
        if own_loader and loader_knobs_searched:
            raise AdaptError(f"tuner (adapt: hf): {type(self).__name__} overrides get_train_dataloader, so the "
                             "trial's loader knobs (dataloader_num_workers, ...) may not reach its DataLoader; "
                             "build it from self.args, or tune it with tuner.config()")
        self.add_callback(ProbeCallback(report=False, trainer=self))

    args_cls.__post_init__ = __post_init__  # type: ignore[method-assign]
    trainer_cls.__init__ = __init__  # type: ignore[method-assign]
