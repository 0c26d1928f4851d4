"""Configs to paste, built from a :class:`~tuner.config.space.Config`.

The DeepSpeed engine trains with exactly :func:`ds_config`, so what is measured is what
is exported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.config.space import Config

ACCELERATE_MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
"""Accelerate's ``mixed_precision`` for each ``amp_dtype`` (config file, kwargs, environment)."""


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


def dataloader_kwargs(config: "Config") -> dict[str, Any]:
    """``torch.utils.data.DataLoader(dataset, sampler=..., **kwargs)``; batch size per rank."""
    return config.dataloader_kwargs()


def accelerate_config(config: "Config", world_size: int, cuda: bool) -> str:
    """An ``accelerate launch --config_file`` YAML (comments say what Accelerate cannot hold)."""
    mixed = ACCELERATE_MIXED_PRECISION[config.amp_dtype]
    if config.engine == "deepspeed":
        kind = "DEEPSPEED"
    elif world_size > 1:
        kind = "MULTI_GPU" if cuda else "MULTI_CPU"
    else:
        kind = "NO"
    lines = [
        "# accelerate launch --config_file accelerate_config.yaml train.py",
        f"# Accelerator(gradient_accumulation_steps={config.grad_accum_steps}); "
        f"DataLoader kwargs: see dataloader.json (batch_size={config.micro_batch_size} per process)",
        "compute_environment: LOCAL_MACHINE",
        f"distributed_type: {kind}",
        f"mixed_precision: {mixed}",
        f"num_processes: {world_size}",
        "num_machines: 1",
        f"use_cpu: {'false' if cuda else 'true'}",
    ]
    if config.engine == "deepspeed":
        lines += [
            "deepspeed_config:",
            "  deepspeed_config_file: ds_config.json",
            f"  zero3_init_flag: {'true' if config.zero_stage == 3 else 'false'}",
        ]
    return "\n".join(lines) + "\n"


def hf_training_args(config: "Config") -> dict[str, Any]:
    """``transformers.TrainingArguments`` fields (their own names)."""
    args: dict[str, Any] = {
        "per_device_train_batch_size": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "dataloader_num_workers": config.num_workers,
        "dataloader_pin_memory": config.pin_memory,
        "bf16": config.amp_dtype == "bf16",
        "fp16": config.amp_dtype == "fp16",
    }
    if config.num_workers > 0:
        args["dataloader_prefetch_factor"] = config.prefetch_factor
        args["dataloader_persistent_workers"] = config.persistent_workers
    if config.engine == "deepspeed":
        args["deepspeed"] = "ds_config.json"
    return args
