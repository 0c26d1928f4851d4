"""Pipeline stages of a decoder-only model: the second part of the parallel layout (issue 27).

A Llama-style model from transformers (``model.model.embed_tokens``, ``.layers``,
``.norm``, ``.rotary_emb`` and ``model.lm_head``) is cut into ``n`` stages of consecutive
blocks, split as evenly as the blocks allow (the first stages take the remainder, as
torchtitan's even split does); the first stage also embeds, the last also normalises and
projects to the vocabulary. Each stage is an ``nn.Module`` that PyTorch's own
``torch.distributed.pipelining.PipelineStage`` runs under any of its schedules (GPipe,
1F1B, interleaved); micro-batches per step follow from micro-batch x accumulation. The
stage computes what the whole model's forward computes between its blocks: the rotary
position embeddings, and the causal mask the model builds itself when given none (eager
attention with no mask attends both ways).

The levers ``pipeline_parallel`` and ``pipeline_schedule`` run it
(:mod:`tuner.trial.engines.layout_engine`). A pipeline feeds the first stage a tensor and
the last stage's loss a target: a batch is token ids (a tensor) or a mapping with
``input_ids`` (and ``labels``, else the ids are the labels, shifted by the loss).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def supported(model: nn.Module) -> str | None:
    """Why ``model`` cannot be cut here (``None``: it can)."""
    inner = getattr(model, "model", None)
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, name):
            return (f"{type(model).__name__} is not a Llama-style decoder (no model.{name}); give the task a "
                    "pipeline_split(model, n), or it is searched without pipeline_parallel")
    if not hasattr(model, "lm_head"):
        return f"{type(model).__name__} has no lm_head"
    return None


def split(blocks: int, stages: int) -> list[range]:
    """Consecutive blocks per stage, as even as they go; refused when there are fewer blocks."""
    if stages < 1 or blocks < stages:
        raise ValueError(f"pipeline_parallel: {stages} stages need at least {stages} blocks; the model has {blocks}")
    size, extra = divmod(blocks, stages)
    out, start = [], 0
    for i in range(stages):
        end = start + size + (1 if i < extra else 0)
        out.append(range(start, end))
        start = end
    return out


class Stage(nn.Module):
    """One stage of a Llama-style decoder: [embedding] -> its blocks -> [norm, head]."""

    def __init__(self, model: nn.Module, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        inner: Any = model.model
        self.embed = inner.embed_tokens if first else None
        self.layers = nn.ModuleList(inner.layers[i] for i in blocks)
        self.rotary = inner.rotary_emb
        self.norm = inner.norm if last else None
        self.head: Any = model.lm_head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x) if self.embed is not None else x
        length = hidden.shape[1]
        positions = torch.arange(length, device=hidden.device).unsqueeze(0)
        rotary = self.rotary(hidden, positions)
        mask = torch.full((length, length), float("-inf"), device=hidden.device, dtype=hidden.dtype).triu(1)
        mask = mask[None, None]
        for layer in self.layers:
            out = layer(hidden, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
            hidden = out[0] if isinstance(out, tuple) else out
        if self.head is not None:
            assert self.norm is not None
            hidden = self.head(self.norm(hidden))
        return hidden


def stage(model: nn.Module, index: int, stages: int) -> Stage:
    """Stage ``index`` of ``stages`` of ``model`` (its other blocks are not referenced)."""
    why = supported(model)
    if why is not None:
        raise ValueError(why)
    parts = split(len(model.model.layers), stages)
    return Stage(model, parts[index], index == 0, index == stages - 1)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Causal LM loss: each position predicts the next token (transformers' shift)."""
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                       tokens[:, 1:].reshape(-1))


def input_ids(batch: Any) -> torch.Tensor:
    """What the first stage takes from a batch: the tensor itself, or its ``input_ids``."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict) and isinstance(batch.get("input_ids"), torch.Tensor):
        return batch["input_ids"]
    raise ValueError(f"pipeline_parallel needs batches of token ids (a tensor, or a mapping with input_ids); this "
                     f"task's batch is a {type(batch).__name__}: give the task a pipeline_split and batches it takes")


def target_ids(batch: Any) -> torch.Tensor:
    """What the last stage's loss compares with: ``labels`` where the batch has them."""
    if isinstance(batch, dict) and isinstance(batch.get("labels"), torch.Tensor):
        return batch["labels"]
    return input_ids(batch)
