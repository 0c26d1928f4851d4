"""Configs to paste, built from a :class:`~tuner.inputs.space.Config`: one function per
file of the run folder (:mod:`tuner.inputs.exports` holds them, by library family).

The DeepSpeed engine trains with exactly :func:`ds_config`, so what is measured is what
is exported.
"""

from __future__ import annotations

from tuner.inputs.exports.engines import dataloader_kwargs, ds_config, torch_settings
from tuner.inputs.exports.titan import TITAN_SCHEDULES, torchtitan_toml
from tuner.inputs.exports.trainers import (
                                           HF_LEVER_FIELDS,
                                           HF_LEVER_OFF,
                                           accelerate_config,
                                           hf_training_args,
                                           lightning_trainer,
)

__all__ = ["HF_LEVER_FIELDS", "HF_LEVER_OFF", "TITAN_SCHEDULES", "accelerate_config", "dataloader_kwargs", "ds_config",
           "hf_training_args", "lightning_trainer", "torch_settings", "torchtitan_toml"]
