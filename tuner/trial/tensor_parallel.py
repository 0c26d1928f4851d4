"""Tensor parallelism from the model's own plan: the first part of the parallel layout (issue 27).

A model family declares how its blocks shard: transformers ships the plan with the model's
config (``config.base_model_tp_plan``, e.g. Llama's ``layers.*.self_attn.q_proj:
colwise`` ... ``layers.*.mlp.down_proj: rowwise``), the same colwise/rowwise split
torchtitan applies. This module reads that plan and applies it with PyTorch's own tensor
parallelism (``torch.distributed.tensor.parallel.parallelize_module`` on a 1-D
``DeviceMesh``): each projection's weight becomes a DTensor shard, colwise outputs stay
local, rowwise inputs are local and their outputs all-reduced.

GPT-2 ships no plan, and PyTorch's styles take only ``nn.Linear`` / ``nn.Embedding``, not
its ``Conv1D`` (a transposed linear), whose ``c_attn`` packs query, key and value in one
matrix. The tuner has its own plan for it (:data:`GPT2_PLAN`), Megatron-LM's split done
by hand (:mod:`tuner.trial.conv1d_parallel`): each rank keeps its heads' columns of the
packed projection and its rows of the output projections, with the all-reduce of the
rowwise outputs in the forward and of the colwise inputs' gradient in the backward.

A degree the model's shapes cannot split is refused before anything runs, with the rule.
The lever ``tensor_parallel`` runs it (:mod:`tuner.trial.engines.layout_engine`).
"""

from __future__ import annotations

import fnmatch
from typing import Any

from torch import nn

STYLES = ("colwise", "rowwise", "colwise_qkv", "colwise_conv1d", "rowwise_conv1d")
"""The plan entries applied here (the last three: :mod:`tuner.trial.conv1d_parallel`);
others (packed, MoE, sequence-parallel norms) are refused."""
GPT2_PLAN = {"transformer.h.*.attn.c_attn": "colwise_qkv", "transformer.h.*.attn.c_proj": "rowwise_conv1d",
             "transformer.h.*.mlp.c_fc": "colwise_conv1d", "transformer.h.*.mlp.c_proj": "rowwise_conv1d"}
"""GPT-2's blocks as Megatron-LM splits them (``Conv1D`` weights are ``[in, out]``)."""


def plan_of(model: nn.Module) -> tuple[dict[str, str] | None, str]:
    """The model's own tensor-parallel plan, with its module names made full, and a line
    saying where it came from or why there is none."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) == "gpt2" and hasattr(model, "transformer"):
        return dict(GPT2_PLAN), "tensor-parallel plan: the tuner's own for GPT-2 (Megatron-LM's split of Conv1D)"
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        return None, (f"{type(model).__name__} ships no tensor-parallel plan (its config has no "
                      "base_model_tp_plan): searched without tensor_parallel")
    odd = sorted({style for style in plan.values() if style not in STYLES})
    if odd:
        return None, f"{type(model).__name__}'s tensor-parallel plan uses {', '.join(odd)}, not applied here"
    prefix = getattr(model, "base_model_prefix", "")
    base = f"{prefix}." if prefix and hasattr(model, prefix) else ""
    return {f"{base}{pattern}": style for pattern, style in plan.items()}, (
        f"tensor-parallel plan: {type(config).__name__}.base_model_tp_plan ({len(plan)} entries)")


def refused(model: nn.Module, degree: int) -> str | None:
    """Why ``degree`` cannot split this model (``None``: it can): every sharded size must
    divide by it, heads and key/value heads included (a head is never split)."""
    if degree < 1:
        return f"tensor_parallel: {degree} is not a degree (>= 1)"
    config = getattr(model, "config", None)
    sizes = {name: getattr(config, name, None) for name in
             ("num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size", "n_inner")}
    for name, size in sizes.items():
        if isinstance(size, int) and size % degree:
            return f"tensor_parallel: {degree} does not divide {name} ({size}); each rank needs whole ones"
    return None


def matches(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """Each module of ``model`` the plan names, with its style (wildcards expanded)."""
    out: dict[str, str] = {}
    names = [name for name, _ in model.named_modules()]
    for pattern, style in plan.items():
        for name in fnmatch.filter(names, pattern):
            out[name] = style
    return out


def parallelize(model: nn.Module, mesh: Any, plan: dict[str, str]) -> int:
    """Shard ``model`` in place over the 1-D ``mesh`` by ``plan``; returns the modules sharded."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tuner.trial import conv1d_parallel

    targets = matches(model, plan)
    if not targets:
        raise ValueError("the tensor-parallel plan names no module of this model")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    dtensor = {name: styles[style]() for name, style in targets.items() if style in styles}
    if dtensor:
        parallelize_module(model, mesh, dtensor)
    by_hand = {name: style for name, style in targets.items() if style not in styles}
    if by_hand:
        conv1d_parallel.shard(model, mesh.get_group(), by_hand)
    return len(targets)
