"""The registry's orders, in one place: a lever's family module declares what it is, and
here is where it stands among the others (its place among a configuration's fields is
:data:`tuner.inputs.plan.ORDER`).

- :data:`PATH`: the attribution's path from the baseline (what feeds the step first).
- :data:`WALK`: the guided walk's one-knob-at-a-time order (likeliest large effect first).
- :data:`VERDICTS`: each verdict's levers, its first choice first (what its advice names).
- :data:`TITLE`: the levers every result row names (console, live view, report); the
  others are named only away from their defaults.
"""

from __future__ import annotations

PATH = (
    "num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "in_order", "amp_dtype", "float8",
    "matmul_precision", "activation_checkpointing", "micro_batch_size", "tensor_parallel", "pipeline_parallel",
    "pipeline_schedule", "sequence_parallel", "zero_stage", "fsdp", "offload_optimizer", "compile",
    "compile_mode", "attention_backend", "channels_last", "cudnn_benchmark", "intra_op_threads", "fused_loss",
    "optimizer_impl", "ddp_bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "overlap_comm",
    "reduce_bucket_size", "allgather_bucket_size", "expandable_segments",
)

WALK = (
    "amp_dtype", "float8", "matmul_precision", "micro_batch_size", "zero_stage", "tensor_parallel",
    "pipeline_parallel", "pipeline_schedule", "sequence_parallel", "fsdp", "activation_checkpointing",
    "fused_loss", "compile", "compile_mode", "attention_backend", "channels_last", "cudnn_benchmark",
    "num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "in_order", "optimizer_impl",
    "ddp_bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "overlap_comm", "reduce_bucket_size",
    "allgather_bucket_size", "offload_optimizer", "expandable_segments", "intra_op_threads",
)

TITLE = ("num_workers", "amp_dtype", "micro_batch_size", "zero_stage")

VERDICTS: dict[str, tuple[str, ...]] = {
    "data-bound": ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "in_order"),
    "loader-memory-bound": ("num_workers", "prefetch_factor"),
    "input-transfer-bound": ("pin_memory",),
    "memory-bound": (
        "fsdp", "zero_stage", "activation_checkpointing", "offload_optimizer", "micro_batch_size", "amp_dtype",
        "tensor_parallel", "pipeline_parallel", "sequence_parallel", "expandable_segments", "fused_loss",
    ),
    "host-cpu-saturated": ("amp_dtype", "micro_batch_size", "compile"),
    "host-bound": ("micro_batch_size", "compile", "optimizer_impl", "amp_dtype", "compile_mode"),
    "compute-bound": (
        "matmul_precision", "compile", "amp_dtype", "micro_batch_size", "optimizer_impl", "channels_last",
        "cudnn_benchmark", "compile_mode", "attention_backend", "float8", "intra_op_threads",
    ),
    "communication-bound": (
        "micro_batch_size", "zero_stage", "fsdp", "ddp_bucket_cap_mb", "static_graph", "gradient_as_bucket_view",
        "overlap_comm", "reduce_bucket_size", "allgather_bucket_size",
    ),
    "pipeline-bound": ("pipeline_schedule", "pipeline_parallel"),
}
