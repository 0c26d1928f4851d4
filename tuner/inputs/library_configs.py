"""The library configs a trial itself runs with: DeepSpeed's JSON (the DeepSpeed engine
trains with exactly :func:`ds_config`), DDP's keywords (:func:`ddp_kwargs`, the trial's DDP
and a script's) and ``TrainingArguments``' fields (script mode's Trainer gets
:func:`hf_training_args`). The run folder writes them unchanged
(:mod:`tuner.outputs.exports`), so what is measured is what is pasted.
"""

from __future__ import annotations

from typing import Any

from tuner.inputs.engine import kind
from tuner.inputs.levers import LEVERS
from tuner.inputs.plan import Plan

DDP_KEYWORDS = {"ddp_bucket_cap_mb": "bucket_cap_mb", "gradient_as_bucket_view": "gradient_as_bucket_view",
                "static_graph": "static_graph"}
"""DDP's levers, and the ``DistributedDataParallel`` keyword each sets."""


def ddp_kwargs(config: Plan) -> dict[str, Any]:
    """``DistributedDataParallel(model, **ddp_kwargs(plan))``: every DDP lever's keyword (at
    its default, DDP's own)."""
    return {keyword: getattr(config, lever) for lever, keyword in DDP_KEYWORDS.items()}


def ds_config(config: Plan, cuda: bool = False) -> dict[str, Any]:
    """A DeepSpeed config: ``train_batch_size`` = micro x accumulation x data-parallel ranks,
    as DeepSpeed checks; the ZeRO block's keys only for the stages that read them, and always
    explicitly (DeepSpeed's own ``overlap_comm`` default differs by stage); ZeRO-3 gathers by
    its own prefetch settings (no ``allgather_bucket_size``). Offload keeps the job's own
    optimizer (DeepSpeed otherwise refuses any but its CPU Adam) and pins its host buffers on
    CUDA (a pageable copy is a synchronous one)."""
    stage = config.zero_stage
    zero: dict[str, Any] = {"stage": stage}
    if stage >= 1:
        zero.update(overlap_comm=config.overlap_comm, reduce_bucket_size=config.reduce_bucket_size)
    if stage in (1, 2):
        zero["allgather_bucket_size"] = config.allgather_bucket_size
    out: dict[str, Any] = {
        "train_batch_size": config.micro_batch_size * config.grad_accum_steps * config.layout.dp,
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "zero_optimization": zero,
        "bf16": {"enabled": config.amp_dtype == "bf16"},
        "fp16": {"enabled": config.amp_dtype == "fp16"},
    }
    if stage >= 1 and config.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": config.offload_optimizer, "pin_memory": cuda}
        out["zero_force_ds_cpu_optimizer"] = False
    return out


def hf_training_args(config: Plan) -> dict[str, Any]:
    """``transformers.TrainingArguments`` fields (their own names, transformers 5). FSDP2 goes
    in ``fsdp_config``, which then holds the checkpointing (FSDP2 checkpoints its own wrapped
    layers: no second all-gather). ``optimizer_impl`` default is the job's own optimizer as it
    builds it: no ``optim`` key, so pasting changes nothing that was not measured."""
    lay = config.layout
    args: dict[str, Any] = {
        "per_device_train_batch_size": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "dataloader_num_workers": config.num_workers,
        "dataloader_pin_memory": config.pin_memory,
        "bf16": config.amp_dtype == "bf16",
        "fp16": config.amp_dtype == "fp16",
        "torch_compile": config.compile,
    }
    if config.optimizer_impl != "default":
        args["optim"] = "adamw_torch_fused" if config.optimizer_impl == "fused" else "adamw_torch"
    if config.matmul_precision == "high":  # TrainingArguments' tf32 is "high"; "medium" (bf16) has no field
        args["tf32"] = True
    if config.num_workers > 0:
        args["dataloader_prefetch_factor"] = config.prefetch_factor
        args["dataloader_persistent_workers"] = config.persistent_workers
    if kind(config.engine).wraps_model:
        args["deepspeed"] = "ds_config.json"
    if kind(config.engine).ddp and config.ddp_bucket_cap_mb != 25:
        args["ddp_bucket_cap_mb"] = config.ddp_bucket_cap_mb
    checkpointing = config.activation_checkpointing != "none"
    if lay.shard:
        args["fsdp"] = True
        args["fsdp_config"] = {"version": 2, "reshard_after_forward": lay.reshard,
                               "activation_checkpointing": checkpointing,
                               "cpu_offload": config.offload_optimizer == "cpu"}
    elif checkpointing:
        args["activation_checkpointing"] = True
        if config.activation_checkpointing == "selective":
            args["activation_checkpointing_kwargs"] = {"every_n_layers": 2}
    if config.compile and config.compile_mode != "default":
        args["torch_compile_mode"] = config.compile_mode
    if config.fused_loss:
        args["use_liger_kernel"] = True
    return args


HF_LEVER_FIELDS = {field.strip(): name for name, lever in LEVERS.items()
                   if lever.group not in ("loader", "batch", "precision")
                   for field in lever.exported.fields.get("hf_training_args.json", "").split("/") if field.strip()}
"""The ``TrainingArguments`` fields each lever beyond the loader, batch and precision sets
(its ``exports``); script mode sets only the recipe's."""
HF_LEVER_OFF = {"activation_checkpointing": False, "activation_checkpointing_kwargs": None, "fsdp": False,
                "fsdp_config": None, "ddp_bucket_cap_mb": None, "tf32": False}
"""What a tuned lever's fields read when it is off (``None``: the Trainer's default; a field
not listed, ``optim``, is left out: the script's own optimizer stands)."""
