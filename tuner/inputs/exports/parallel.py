"""What the sharding and pipeline levers write that the exporters' own rendering of the
:class:`~tuner.inputs.layout.Layout` (degrees, sharded or replicated copies, resharding)
does not hold: transformers' FSDP fields, and the comment that a library has no pipeline
parallelism of its own (the degree and schedule measured are in torchtitan.toml).
"""

from __future__ import annotations

from typing import Any

from tuner.inputs.levers.common import Config

HF_OFF = {"fsdp": False, "fsdp_config": None}
"""``TrainingArguments``' FSDP fields when the lever is off (``None``: the Trainer's default)."""


def fsdp_exports(config: Config, file: str, world_size: int) -> Any:
    lay = config.layout(world_size)
    if file != "hf_training_args.json" or not lay.shard:
        return None
    # the plugin's own checkpointing key, which the checkpointing lever sets: FSDP2 checkpoints
    # its wrapped layers itself (no second all-gather)
    return {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": lay.reshard,
                                          "activation_checkpointing": False,
                                          "cpu_offload": config.offload_optimizer == "cpu"}}


def pipeline_exports(config: Config, file: str, world_size: int) -> Any:
    lay = config.layout(world_size)
    if lay.pp == 1:
        return None
    if file == "accelerate_config.yaml":
        return {"#": [f"pipeline_parallel {lay.pp} ({lay.schedule}): Accelerate has no pipeline parallelism of its "
                      "own; see torchtitan.toml"]}
    if file == "lightning_trainer.yaml":
        return {"#": [f"pipeline_parallel {lay.pp}: Lightning has no pipeline parallelism of its own; see "
                      "torchtitan.toml"]}
    return None
