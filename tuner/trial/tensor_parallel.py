"""Tensor parallelism from the model's own plan: the first part of the parallel layout (issue 27).

A model family declares how its blocks shard: transformers ships the plan with the model's
config (``config.base_model_tp_plan``, e.g. Llama's ``layers.*.self_attn.q_proj:
colwise`` ... ``layers.*.mlp.down_proj: rowwise``), the same colwise/rowwise split
torchtitan applies. This module reads that plan and applies it with PyTorch's own tensor
parallelism (``torch.distributed.tensor.parallel.parallelize_module`` on a 1-D
``DeviceMesh``): each projection's weight becomes a DTensor shard, colwise outputs stay
local, rowwise inputs are local and their outputs all-reduced. A model whose family ships
no plan (GPT-2's ``Conv1D`` blocks have none) gets none, with the reason; a degree the
model's shapes cannot split is refused before anything runs, with the rule.

Not yet a lever: the search does not choose a degree from this (the layout levers, the
pipeline stages and the memory model come next, on the lever registry).
"""

from __future__ import annotations

import fnmatch
from typing import Any

from torch import nn

STYLES = ("colwise", "rowwise")
"""The plan entries applied here; others (packed, MoE, sequence-parallel norms) are refused."""


def plan_of(model: nn.Module) -> tuple[dict[str, str] | None, str]:
    """The model's own tensor-parallel plan, with its module names made full, and a line
    saying where it came from or why there is none."""
    config = getattr(model, "config", None)
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
             ("num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size")}
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

    targets = matches(model, plan)
    if not targets:
        raise ValueError("the tensor-parallel plan names no module of this model")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    parallelize_module(model, mesh, {name: styles[style]() for name, style in targets.items()})
    return len(targets)
