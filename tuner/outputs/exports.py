"""The configs to paste, one writer per file of the run folder: ``(config, cuda) -> the
file's text``. :data:`WRITERS` is the one list of them; a new output format is
one writer and one row. Each writer reads the configuration and its
:class:`~tuner.inputs.layout.Layout` and writes its library's terms, with a comment where a
library cannot hold what was measured. DeepSpeed's JSON and ``TrainingArguments`` are what
the trials themselves run with (:mod:`tuner.inputs.library_configs`), written unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from tuner.inputs.engine import kind
from tuner.inputs.levers import dataloader_kwargs
from tuner.inputs.levers.kernels import BACKENDS
from tuner.inputs.levers.precision import ACCELERATE_MIXED_PRECISION, LIGHTNING_PRECISION
from tuner.inputs.levers.process import ALLOC_CONF
from tuner.inputs.library_configs import DDP_KEYWORDS, ds_config, hf_training_args
from tuner.inputs.plan import FIELDS, Plan


def accelerate_config(config: Plan, cuda: bool) -> str:
    """Accelerate's YAML; comments say what it cannot hold. FSDP2 goes in its FSDP plugin,
    version 2 (``fsdp_reshard_after_forward`` for full_shard vs shard_grad_op, checkpointing,
    offload), tensor parallelism in its ``parallelism_config`` (with FSDP2 only), compile in
    its dynamo section."""
    lay, world_size = config.layout, config.world_size
    deepspeed, fsdp = kind(config.engine).wraps_model, lay.shard or lay.tp > 1
    if deepspeed:
        distributed = "DEEPSPEED"
    elif fsdp:
        distributed = "FSDP"
    elif world_size > 1:
        distributed = "MULTI_GPU" if cuda else "MULTI_CPU"
    else:
        distributed = "NO"
    checkpointing = config.activation_checkpointing
    lines = [
        "# accelerate launch --config_file accelerate_config.yaml train.py",
        f"# Accelerator(gradient_accumulation_steps={config.grad_accum_steps}); "
        f"DataLoader kwargs: see dataloader.json (batch_size={config.micro_batch_size} per process)",
        "compute_environment: LOCAL_MACHINE",
        f"distributed_type: {distributed}",
        f"mixed_precision: {ACCELERATE_MIXED_PRECISION[config.amp_dtype]}",
        f"num_processes: {world_size}",
        "num_machines: 1",
        f"use_cpu: {_bool(not cuda)}",
    ]
    if deepspeed:
        lines += ["deepspeed_config:", "  deepspeed_config_file: ds_config.json",
                  f"  zero3_init_flag: {_bool(config.zero_stage == 3)}"]
    if fsdp:
        lines += [
            "# FSDP2 wraps the classes in fsdp_transformer_layer_cls_to_wrap (default: the model's _no_split_modules)",
            "fsdp_config:",
            "  fsdp_version: 2",
            f"  fsdp_reshard_after_forward: {_bool(lay.reshard)}",
            f"  fsdp_activation_checkpointing: {_bool(checkpointing != 'none')}",
            f"  fsdp_offload_params: {_bool(config.offload_optimizer == 'cpu')}",
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
            "  fsdp_state_dict_type: SHARDED_STATE_DICT",
        ]
    if lay.tp > 1:  # Accelerate's ParallelismConfig (torchtitan's ParallelDims)
        lines += ["parallelism_config:",
                  f"  parallelism_config_dp_replicate_size: {lay.dp_replicate}",
                  f"  parallelism_config_dp_shard_size: {lay.dp_shard}",
                  f"  parallelism_config_tp_size: {lay.tp}",
                  "  parallelism_config_cp_size: 1"]
    if lay.pp > 1:
        lines.append(f"# pipeline_parallel {lay.pp} ({lay.schedule}): Accelerate has no pipeline parallelism of its "
                     "own; see torchtitan.toml")
    if checkpointing != "none" and not lay.shard:
        lines.append(f"# activation checkpointing ({checkpointing}): model.gradient_checkpointing_enable() in the "
                     "script; Accelerate's config has no key for it")
    if config.compile:
        lines += ["dynamo_config:", "  dynamo_backend: INDUCTOR"]
        if config.compile_mode != "default":
            lines.append(f"  dynamo_mode: {config.compile_mode}")
    return "\n".join(lines) + "\n"


def lightning_trainer(config: Plan, cuda: bool) -> str:
    """``python train.py fit --config lightning_trainer.yaml``: the Trainer's precision,
    accumulation and strategy (DDP, a DeepSpeed stage, ModelParallelStrategy for tensor
    parallelism, or FSDP with its resharding and offload), and the data module's batch size
    and loader workers (``data.batch_size`` / ``data.num_workers``: the usual names; rename
    them to your DataModule's)."""
    lay, world_size = config.layout, config.world_size
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
    elif flags := {kwarg: value for kwarg, value in _ddp_kwargs(config).values() if kwarg != "bucket_cap_mb"}:
        strategy = {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": flags}
    else:
        strategy = "ddp" if world_size > 1 else "auto"
    lines = ["# python train.py fit --config lightning_trainer.yaml   (LightningCLI)",
             "trainer:",
             f"  accelerator: {'gpu' if cuda else 'cpu'}",
             f"  devices: {world_size}",
             f"  precision: {LIGHTNING_PRECISION[config.amp_dtype]}",
             f"  accumulate_grad_batches: {config.grad_accum_steps}"]
    if isinstance(strategy, str):
        lines.append(f"  strategy: {strategy}")
    else:
        if lay.tp > 1:
            lines += ["  # ModelParallelStrategy hands configure_model() a (data_parallel, tensor_parallel) device "
                      "mesh:", "  # apply the tensor-parallel plan there, then fully_shard on the data-parallel "
                      "dimension"]
        elif lay.shard:
            lines += ["  # Lightning's FSDPStrategy is FSDP1 with the same sharding; the trials ran FSDP2 "
                      "(fully_shard),", "  # which Lightning runs as ModelParallelStrategy with fully_shard in "
                      "configure_model()"]
        lines += ["  strategy:", f"    class_path: {strategy['class_path']}", "    init_args:"]
        lines += [f"      {k}: {_bool(v) if isinstance(v, bool) else v}" for k, v in strategy["init_args"].items()]
    if lay.pp > 1:
        lines.append(f"# pipeline_parallel {lay.pp}: Lightning has no pipeline parallelism of its own; see "
                     "torchtitan.toml")
    lines += ["data:", f"  batch_size: {config.micro_batch_size}", f"  num_workers: {config.num_workers}"]
    return "\n".join(lines) + "\n"


TITAN_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved_1f1b": "Interleaved1F1B"}
"""torchtitan's ``pipeline_parallel_schedule`` (torch.distributed.pipelining's class names)."""
SELECTIVE = {"none": ("none", None), "full": ("full", None), "selective": ("selective", ("2", "every 2nd block")),
             "op": ("selective", ("op", "each block, its matmul and attention outputs kept"))}
"""``[activation_checkpoint]``'s ``mode`` and ``selective_ac_option`` (with its comment) per
``activation_checkpointing`` value."""


def torchtitan_toml(config: Plan, cuda: bool = True) -> str:
    """Batch, precision (torchtitan has no fp16: the nearest is said beside it), the parallel
    layout (data-parallel sharding or replication, tensor and pipeline degrees, the
    schedule), compile, checkpointing, optimizer kernels and float8; comments where
    torchtitan has no key for what was measured."""
    lay = config.layout
    param = {"bf16": '"bfloat16"', "fp16": '"float32"  # fp16: torchtitan trains in bf16 or fp32 (no loss scaling); '
                                          "bf16 is the nearest"}.get(config.amp_dtype, '"float32"')
    lines = [
        "# torchtitan job config fragment: merge into your train config (.toml)",
        "[training]",
        f"local_batch_size = {config.micro_batch_size}",
        f"global_batch_size = {config.micro_batch_size * config.grad_accum_steps * lay.dp}"
        f"  # {config.grad_accum_steps} gradient accumulation step(s) x {lay.dp} data-parallel rank(s)",
        f"mixed_precision_param = {param}",
        'mixed_precision_reduce = "float32"',
        f"compile = {_bool(config.compile)}",
        f"enable_cpu_offload = {_bool(lay.shard and config.offload_optimizer == 'cpu')}",
        "",
        "[parallelism]",
        f"data_parallel_shard_degree = {lay.dp_shard}",
        f"data_parallel_replicate_degree = {lay.dp_replicate}",
        f"tensor_parallel_degree = {lay.tp}",
        f"pipeline_parallel_degree = {lay.pp}",
    ]
    if lay.tp > 1:
        lines.append("enable_async_tensor_parallel = false  # not measured here: try it with compile on your GPUs")
        lines.append(f"# sequence_parallel measured {'on' if config.sequence_parallel else 'off'}: torchtitan shards "
                     "the norms over the sequence with every tensor_parallel_degree > 1 (no switch)")
    if lay.pp > 1:
        lines += [f'pipeline_parallel_schedule = "{TITAN_SCHEDULES[lay.schedule]}"',
                  f"pipeline_parallel_microbatch_size = {config.micro_batch_size}"]
    if lay.shard:
        lines.append(f'fsdp_reshard_after_forward = "{"always" if lay.reshard else "never"}"')
    if kind(config.engine).wraps_model:
        lines.append(f"# ZeRO stage {config.zero_stage} has no torchtitan equivalent; its FSDP2 is "
                     "data_parallel_shard_degree > 1")
    mode, option = SELECTIVE[config.activation_checkpointing]
    lines += ["", "[activation_checkpoint]", f'mode = "{mode}"']
    if option is not None:
        lines.append(f'selective_ac_option = "{option[0]}"  # {option[1]}')
    implementation = {"default": "for-loop", "foreach": "foreach", "fused": "fused"}[config.optimizer_impl]
    lines += ["", "[optimizer]", f'implementation = "{implementation}"']
    if config.compile and config.compile_mode != "default":
        lines.append(f"# compile_mode {config.compile_mode} measured: torchtitan compiles each block in the default "
                     f"mode (no key); pass mode={config.compile_mode!r} to torch.compile in your own loop")
    if config.float8 != "off":
        gather = _bool(lay.shard and config.float8 == "tensorwise")
        lines += ["", "[model]", 'converters = ["float8"]', "", "[float8]", f"enable_fsdp_float8_all_gather = {gather}",
                  f"precompute_float8_dynamic_scale_for_fsdp = {gather}"]
        if config.float8 == "rowwise":
            lines.append('recipe_name = "rowwise"')
    if config.expandable_segments:
        lines.append(f"# expandable_segments measured on: run with {ALLOC_CONF}=expandable_segments:True in the "
                     "environment (torchtitan's run_train.sh sets it)")
    return "\n".join(lines) + "\n"


SAVED_OPS = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention")
"""The ATen operators ``activation_checkpointing: op`` keeps (their outputs saved); the rest
of each block is recomputed."""


def _ddp_kwargs(config: Plan) -> dict[str, tuple[str, Any]]:
    """DDP's levers away from their defaults, where DDP runs: lever -> (DDP's keyword, value)."""
    if not kind(config.engine).ddp:
        return {}
    return {lever: (keyword, getattr(config, lever)) for lever, keyword in DDP_KEYWORDS.items()
            if getattr(config, lever) != FIELDS[lever].default}


def torch_settings(config: Plan, cuda: bool = True) -> str:
    """Process-wide flags, the model's memory format, DDP's buckets, the selective
    checkpointing policy, compile's mode, the attention kernel, float8, the allocator and
    Liger's loss, each where it differs from its default, for the training script to run
    before the model is wrapped."""
    lines = ["# Settings the tuner measured that no config file above carries: run them in the training",
             "# script, before the model is wrapped (levers at their defaults are left out).", "import torch"]
    ddp = _ddp_kwargs(config)
    if ddp:
        lines.append(f"model = DistributedDataParallel(model, {', '.join(f'{k}={v!r}' for k, v in ddp.values())})  "
                     f"# {', '.join(ddp)}")
    if config.matmul_precision != "highest":
        lines.append(f"torch.set_float32_matmul_precision({config.matmul_precision!r})  # matmul_precision")
    if config.channels_last:
        lines.append("model = model.to(memory_format=torch.channels_last)  # and each image batch: "
                     "x.to(memory_format=torch.channels_last)  # channels_last")
    if config.cudnn_benchmark:
        lines.append("torch.backends.cudnn.benchmark = True  # cudnn_benchmark")
    if config.intra_op_threads != 0:
        lines.append(f"torch.set_num_threads({config.intra_op_threads!r})  # intra_op_threads")
    if config.activation_checkpointing == "op":
        saved = ", ".join(f"torch.ops.aten.{op}.default" for op in SAVED_OPS)
        lines += ["from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts",
                  f"_saved = {{{saved}}}  # activation_checkpointing op: matmul and attention outputs kept",
                  "def op_context():  # the rest of each block recomputed in the backward",
                  "    return create_selective_checkpoint_contexts(lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE "
                  "if op in _saved else CheckpointPolicy.PREFER_RECOMPUTE)",
                  "# each block: checkpoint(block, x, use_reentrant=False, context_fn=op_context); transformers: "
                  "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False, "
                  "'context_fn': op_context})"]
    mode = config.compile_mode
    if config.compile and mode != "default":
        lines.append(f"# each repeated block compiled as measured: block.compile(mode={mode!r}); a torch.nn built-in "
                     f"block (nn.Linear, nn.TransformerEncoderLayer) compiles only as block.forward = "
                     f"torch.compile(block.forward, mode={mode!r})")
    if config.attention_backend != "default":
        lines += ["from torch.nn.attention import SDPBackend, sdpa_kernel",
                  f"attention = sdpa_kernel(SDPBackend.{BACKENDS[config.attention_backend]})  # enter it around each "
                  "forward: with attention: loss = ...; the model calls scaled_dot_product_attention "
                  "(transformers: attn_implementation='sdpa')"]
    if config.float8 != "off":
        lines += ["from torchao.float8 import Float8LinearConfig, convert_to_float8_training",
                  f"convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name({config.float8!r}))  "
                  "# before FSDP2 wraps it; the Linear layers whose sizes divide by 16, not the output head"]
    if config.expandable_segments:
        lines += ["import os", f"os.environ[{ALLOC_CONF!r}] = 'expandable_segments:True'  # before the first CUDA "
                               "call, or in the job's environment"]
    if config.fused_loss:
        lines += ["from liger_kernel.transformers import _apply_liger_kernel_to_instance",
                  "_apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=True, cross_entropy=False)  "
                  "# a transformers causal LM: its head and loss in chunks"]
    if len(lines) == 3:
        lines.append("# nothing to set: every such lever is at its default")
    return "\n".join(lines) + "\n"


Writer = Callable[[Plan, bool], str]
"""``(config, cuda) -> the file's text``; ``cuda``: the trials ran on GPUs (a writer that
does not depend on it takes it still)."""


def json_text(data: Any) -> str:
    """A JSON file as the run folder writes it."""
    return json.dumps(data, indent=2) + "\n"


WRITERS: dict[str, Writer] = {
    "dataloader.json": lambda config, cuda: json_text(dataloader_kwargs(config)),
    "ds_config.json": lambda config, cuda: json_text(ds_config(config, cuda)),
    "accelerate_config.yaml": accelerate_config,
    "hf_training_args.json": lambda config, cuda: json_text(hf_training_args(config)),
    "torchtitan.toml": torchtitan_toml,
    "torch_settings.py": torch_settings,
    "lightning_trainer.yaml": lightning_trainer,
}
"""Every config to paste, in the order the run folder lists them
(:data:`tuner.inputs.lever.EXPORT_FILES`, which the levers' declarations name)."""


def write_exports(config: Plan, cuda: bool, out: Path) -> None:
    """Every file of :data:`WRITERS` into ``out``."""
    for name, writer in WRITERS.items():
        (out / name).write_text(writer(config, cuda), encoding="utf-8")


def _bool(value: bool) -> str:
    return "true" if value else "false"
