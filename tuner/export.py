"""Configs to paste, built from a :class:`~tuner.space.Config`.

The DeepSpeed engine trains with exactly :func:`ds_config`, so what is measured is what
is exported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.space import Config


def ds_config(config: "Config", world_size: int) -> dict[str, Any]:
    """A DeepSpeed config: batch sizes, ZeRO stage and precision.

    ``train_batch_size`` = micro x accumulation x world size, as DeepSpeed checks.
    """
    return {
        "train_batch_size": config.micro_batch_size * config.grad_accum_steps * world_size,
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": config.amp_dtype == "bf16"},
        "fp16": {"enabled": config.amp_dtype == "fp16"},
    }
