"""Configs to paste for the trainer libraries: Accelerate's YAML, transformers'
``TrainingArguments`` and LightningCLI's YAML."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.inputs.engine import kind
from tuner.inputs.exports import checkpointing, parallel
from tuner.inputs.exports.fragments import lever_fragments, merge_dict, merge_yaml_lines
from tuner.inputs.levers import LEVERS

if TYPE_CHECKING:
    from tuner.inputs.space import Config

def accelerate_config(config: "Config", world_size: int, cuda: bool) -> str:
    """An ``accelerate launch --config_file`` YAML (comments say what Accelerate cannot hold).

    FSDP2 goes in Accelerate's FSDP plugin, version 2 (``fsdp_reshard_after_forward`` for
    full_shard vs shard_grad_op, checkpointing, offload); compile in its dynamo section.
    """
    lay = config.layout(world_size)
    if kind(config.engine).wraps_model:
        distributed = "DEEPSPEED"
    elif lay.shard or lay.tp > 1:  # Accelerate composes tensor parallelism with FSDP2 only
        distributed = "FSDP"
    elif world_size > 1:
        distributed = "MULTI_GPU" if cuda else "MULTI_CPU"
    else:
        distributed = "NO"
    lines = [
        "# accelerate launch --config_file accelerate_config.yaml train.py",
        f"# Accelerator(gradient_accumulation_steps={config.grad_accum_steps}); "
        f"DataLoader kwargs: see dataloader.json (batch_size={config.micro_batch_size} per process)",
        "compute_environment: LOCAL_MACHINE",
        f"distributed_type: {distributed}",
        "mixed_precision: no",  # the precision lever's export sets its own
        f"num_processes: {world_size}",
        "num_machines: 1",
        f"use_cpu: {'false' if cuda else 'true'}",
    ]
    if kind(config.engine).wraps_model:
        lines += [
            "deepspeed_config:",
            "  deepspeed_config_file: ds_config.json",
            f"  zero3_init_flag: {'true' if config.zero_stage == 3 else 'false'}",
        ]
    if lay.shard or lay.tp > 1:
        lines += [
            "# FSDP2 wraps the classes in fsdp_transformer_layer_cls_to_wrap (default: the model's _no_split_modules)",
            "fsdp_config:",
            "  fsdp_version: 2",
            f"  fsdp_reshard_after_forward: {_yaml_bool(lay.reshard)}",
            "  fsdp_activation_checkpointing: false",
            f"  fsdp_offload_params: {_yaml_bool(config.offload_optimizer == 'cpu')}",
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
            "  fsdp_state_dict_type: SHARDED_STATE_DICT",
        ]
    if lay.tp > 1:  # Accelerate's ParallelismConfig (torchtitan's ParallelDims); tp needs dp_shard
        lines += ["parallelism_config:",
                  f"  parallelism_config_dp_replicate_size: {lay.dp_replicate}",
                  f"  parallelism_config_dp_shard_size: {lay.dp_shard}",
                  f"  parallelism_config_tp_size: {lay.tp}",
                  "  parallelism_config_cp_size: 1"]
    for fragment in lever_fragments(config, "accelerate_config.yaml", world_size):
        lines = merge_yaml_lines(lines, fragment)
    return "\n".join(lines) + "\n"


HF_LEVER_FIELDS = {field.strip(): name for name, lever in LEVERS.items()
                   if lever.group not in ("loader", "batch", "precision")
                   for field in lever.exported.fields.get("hf_training_args.json", "").split("/") if field.strip()}
"""The ``TrainingArguments`` fields each lever beyond the loader, batch and precision sets
(its ``exports``); script mode sets only the recipe's."""
HF_LEVER_OFF = {**checkpointing.HF_OFF, **parallel.HF_OFF, "ddp_bucket_cap_mb": None, "tf32": False}
"""What a tuned lever's fields read when it is off (``None``: the Trainer's default; a field
not listed, ``optim``, is left out: the script's own optimizer stands)."""


def hf_training_args(config: "Config") -> dict[str, Any]:
    """``transformers.TrainingArguments`` fields (their own names, transformers 5)."""
    args: dict[str, Any] = {
        "per_device_train_batch_size": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "dataloader_num_workers": config.num_workers,
        "dataloader_pin_memory": config.pin_memory,
        "bf16": False,  # the precision lever's export sets its own
        "fp16": False,
        "torch_compile": config.compile,
    }
    # optimizer_impl default is the job's own optimizer as it builds it (an HF script's Trainer
    # default is adamw_torch_fused in transformers 5): no optim key, so pasting changes nothing
    # that was not measured; fused and foreach name AdamW's kernels.
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
    for fragment in lever_fragments(config, "hf_training_args.json", 1):
        merge_dict(args, fragment)
    return args


def lightning_trainer(config: "Config", world_size: int, cuda: bool) -> str:
    """A LightningCLI config (``python train.py fit --config lightning_trainer.yaml``): the
    Trainer's precision, accumulation and strategy (DDP, a DeepSpeed stage, or FSDP with
    its resharding and offload), and the data module's batch size and loader workers
    (``data.batch_size`` / ``data.num_workers``: the usual names; rename them to your
    DataModule's)."""
    lay = config.layout(world_size)
    if kind(config.engine).wraps_model:
        offload = "_offload" if config.offload_optimizer == "cpu" else ""
        strategy: Any = f"deepspeed_stage_{config.zero_stage}{offload}"
    elif lay.tp > 1:  # tensor parallelism, and FSDP2 over the rest, applied in configure_model()
        strategy = {"class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
                    "init_args": {"data_parallel_size": lay.dp, "tensor_parallel_size": lay.tp}}
    elif lay.shard:
        strategy = {"class_path": "lightning.pytorch.strategies.FSDPStrategy",
                    "init_args": {"sharding_strategy": "FULL_SHARD" if lay.reshard else "SHARD_GRAD_OP",
                                  "cpu_offload": config.offload_optimizer == "cpu"}}
    else:
        strategy = "ddp" if world_size > 1 else "auto"
    lines = ["# python train.py fit --config lightning_trainer.yaml   (LightningCLI)",
             "trainer:",
             f"  accelerator: {'gpu' if cuda else 'cpu'}",
             f"  devices: {world_size}",
             "  precision: 32-true",  # the precision lever's export sets its own
             f"  accumulate_grad_batches: {config.grad_accum_steps}"]
    if isinstance(strategy, str):
        lines.append(f"  strategy: {strategy}")
    elif lay.tp > 1:
        lines += ["  # ModelParallelStrategy hands configure_model() a (data_parallel, tensor_parallel) device mesh:",
                  "  # apply the tensor-parallel plan there, then fully_shard on the data-parallel dimension",
                  "  strategy:", f"    class_path: {strategy['class_path']}", "    init_args:"]
        lines += [f"      {k}: {v}" for k, v in strategy["init_args"].items()]
    else:
        lines += ["  # Lightning's FSDPStrategy is FSDP1 with the same sharding; the trials ran FSDP2 (fully_shard),",
                  "  # which Lightning runs as ModelParallelStrategy with fully_shard in configure_model()",
                  "  strategy:", f"    class_path: {strategy['class_path']}", "    init_args:"]
        lines += [f"      {k}: {_yaml_bool(v) if isinstance(v, bool) else v}" for k, v in strategy["init_args"].items()]
    for fragment in lever_fragments(config, "lightning_trainer.yaml", world_size):
        lines = merge_yaml_lines(lines, fragment)  # the trainer's, before the data module's block
    lines += ["data:", f"  batch_size: {config.micro_batch_size}", f"  num_workers: {config.num_workers}"]
    return "\n".join(lines) + "\n"


def _yaml_bool(value: bool) -> str:
    return "true" if value else "false"
