"""A torchtitan job config fragment (TOML), the parallel layout's section included."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.inputs.engine import kind
from tuner.inputs.exports.fragments import lever_fragments, merge_toml_lines

if TYPE_CHECKING:
    from tuner.inputs.space import Config

TITAN_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved_1f1b": "Interleaved1F1B"}
"""torchtitan's ``pipeline_parallel_schedule`` (torch.distributed.pipelining's class names)."""


def torchtitan_toml(config: "Config", world_size: int) -> str:
    """A fragment of a torchtitan job config (TOML): batch, precision, the parallel layout
    (data-parallel sharding or replication, tensor and pipeline degrees, the schedule),
    compile, optimizer kernels, and what each lever's own export adds (checkpointing's
    section, a model converter's)."""
    lay = config.layout(world_size)
    lines = [
        "# torchtitan job config fragment: merge into your train config (.toml)",
        "[training]",
        f"local_batch_size = {config.micro_batch_size}",
        f"global_batch_size = {config.micro_batch_size * config.grad_accum_steps * lay.dp}"
        f"  # {config.grad_accum_steps} gradient accumulation step(s) x {lay.dp} data-parallel rank(s)",
        'mixed_precision_param = "float32"',  # the precision lever's export sets its own
        'mixed_precision_reduce = "float32"',
        f"compile = {_toml_bool(config.compile)}",
        f"enable_cpu_offload = {_toml_bool(lay.shard and config.offload_optimizer == 'cpu')}",
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
    lines += ["", "[activation_checkpoint]", 'mode = "none"']  # the checkpointing lever's export sets it
    implementation = {"default": "for-loop", "foreach": "foreach", "fused": "fused"}[config.optimizer_impl]
    lines += ["", "[optimizer]", f'implementation = "{implementation}"']
    for fragment in lever_fragments(config, "torchtitan.toml", world_size):
        lines = merge_toml_lines(lines, fragment)
    return "\n".join(lines) + "\n"


def _toml_bool(value: bool) -> str:
    return "true" if value else "false"
