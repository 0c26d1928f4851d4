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
from tuner.inputs.levers.precision import ACCELERATE_MIXED_PRECISION, LIGHTNING_PRECISION

__all__ = ["ACCELERATE_MIXED_PRECISION", "HF_LEVER_FIELDS", "HF_LEVER_OFF", "LIGHTNING_PRECISION", "TITAN_SCHEDULES",
           "accelerate_config", "dataloader_kwargs", "ds_config", "hf_training_args", "lightning_trainer",
           "torch_settings", "torchtitan_toml"]
