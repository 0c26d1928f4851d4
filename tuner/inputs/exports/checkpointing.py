"""What ``activation_checkpointing`` writes into the configs to paste (its ``export_with``).

Each library holds it in its own terms: Accelerate only inside its FSDP plugin (a comment
points elsewhere without it), ``TrainingArguments`` as ``activation_checkpointing`` (inside
``fsdp_config`` under FSDP2, which checkpoints its own wrapped layers: no second
all-gather), torchtitan's ``[activation_checkpoint]`` section, and, for ``op``, the
selective policy as lines of Python, since no library config holds a ``context_fn``
(TrainingArguments' kwargs are JSON; torchtitan's is ``selective_ac_option``).
"""

from __future__ import annotations

from typing import Any

from tuner.inputs.levers.common import Config

HF_OFF = {"activation_checkpointing": False, "activation_checkpointing_kwargs": None}
"""``TrainingArguments``' checkpointing fields when the lever is off (``None``: the Trainer's default)."""
SAVED_OPS = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention")
"""The ATen operators ``op`` keeps (their outputs saved); the rest of each block is recomputed."""


def checkpointing_exports(config: Config, file: str, world_size: int) -> Any:
    mode = config.activation_checkpointing
    lay = config.layout(world_size)
    if file == "accelerate_config.yaml":
        if mode == "none":
            return None
        out: dict[str, Any] = {}
        if lay.shard or lay.tp > 1:  # the exporter's FSDP plugin block
            out["fsdp_config"] = {"fsdp_activation_checkpointing": True}
        if not lay.shard:
            out["#"] = [f"activation checkpointing ({mode}): model.gradient_checkpointing_enable() in the script; "
                        "Accelerate's config has no key for it"]
        return out
    if file == "hf_training_args.json":
        if mode == "none":
            return None
        if lay.shard:
            return {"fsdp_config": {"activation_checkpointing": True}}
        return {"activation_checkpointing": True,
                **({"activation_checkpointing_kwargs": {"every_n_layers": 2}} if mode == "selective" else {})}
    if file == "torchtitan.toml":
        section: dict[str, Any] = {"mode": "selective" if mode == "op" else mode}
        if mode == "selective":
            section["selective_ac_option"] = ("2", "every 2nd block")
        if mode == "op":
            section["selective_ac_option"] = ("op", "each block, its matmul and attention outputs kept")
        return {"activation_checkpoint": section}
    if file == "torch_settings.py" and mode == "op":
        saved = ", ".join(f"torch.ops.aten.{op}.default" for op in SAVED_OPS)
        return ["from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts",
                f"_saved = {{{saved}}}  # activation_checkpointing op: matmul and attention outputs kept",
                "def op_context():  # the rest of each block recomputed in the backward",
                "    return create_selective_checkpoint_contexts(lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE "
                "if op in _saved else CheckpointPolicy.PREFER_RECOMPUTE)",
                "# each block: checkpoint(block, x, use_reentrant=False, context_fn=op_context); transformers: "
                "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False, "
                "'context_fn': op_context})"]
    return None
