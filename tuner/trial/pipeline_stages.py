"""Pipeline stages of a decoder-only model: the second part of the parallel layout.

Two transformers families, by module names: Llama-style decoders (``model.model.layers``)
and GPT-2 (``model.transformer.h``). The blocks are cut into ``n`` stages of consecutive
blocks, the first stages taking the remainder (torchtitan's even split); the first stage
also embeds, the last also normalises and projects to the vocabulary. Each stage is an
``nn.Module`` that ``torch.distributed.pipelining.PipelineStage`` runs under any schedule,
computing what the whole model computes between its blocks (position embeddings, causal
attention: no mask under ``sdpa`` and FlashAttention, an additive mask otherwise).

GPT-2's output projection is tied to its token embedding; :func:`tied` names it, and the
layout engine sums the two stages' copies' gradients before each optimizer step (as
Megatron-LM does), so they stay one parameter. A batch is token ids, or a mapping with
``input_ids`` (and ``labels``, else the ids shifted).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

FAMILIES = {
    "llama": {"inner": "model", "embed": "embed_tokens", "layers": "layers", "norm": "norm", "rotary": "rotary_emb"},
    "gpt2": {"inner": "transformer", "embed": "wte", "layers": "h", "norm": "ln_f", "positions": "wpe", "drop": "drop"},
}
"""Where each family keeps its parts (the head is ``model.lm_head`` in both)."""


def family(model: nn.Module) -> str | None:
    for name, parts in FAMILIES.items():
        inner = getattr(model, parts["inner"], None)
        if inner is not None and all(hasattr(inner, parts[k]) for k in parts if k != "inner"):
            return name
    return None


def supported(model: nn.Module) -> str | None:
    """Why ``model`` cannot be cut here (``None``: it can)."""
    if family(model) is None:
        return (f"{type(model).__name__} is neither a Llama-style decoder (model.embed_tokens, model.layers, "
                "model.norm) nor GPT-2 (transformer.wte, transformer.h); give the task a pipeline_split(model, n), "
                "or it is searched without pipeline_parallel")
    if not hasattr(model, "lm_head"):
        return f"{type(model).__name__} has no lm_head"
    return None


CAUSAL_BY_FLAG = ("sdpa", "flash_attention")
"""Attention implementations (prefixes of transformers' ``attn_implementation``) that run
causal attention from ``is_causal`` when given no mask: transformers' ``sdpa_attention_forward``
sets ``is_causal = q_length > 1 and attention_mask is None`` (5.x), its FlashAttention path
takes ``causal=module.is_causal``. Eager and flex attention do not: they need the mask."""


def causal_by_flag(model: nn.Module) -> bool:
    """Whether ``model``'s attention is causal with no mask (see :data:`CAUSAL_BY_FLAG`)."""
    kind = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return isinstance(kind, str) and kind.startswith(CAUSAL_BY_FLAG)


def blocks_of(model: nn.Module) -> nn.ModuleList:
    parts = FAMILIES[family(model) or ""]
    return getattr(getattr(model, parts["inner"]), parts["layers"])


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
    """One stage of a decoder: [embedding] -> its blocks -> [norm, head]."""

    def __init__(self, model: nn.Module, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.family = family(model)
        self.causal_by_flag = causal_by_flag(model)
        parts = FAMILIES[self.family or ""]
        inner: Any = getattr(model, parts["inner"])
        self.embed = getattr(inner, parts["embed"]) if first else None
        self.positions = getattr(inner, parts["positions"]) if first and "positions" in parts else None
        self.drop = getattr(inner, parts["drop"]) if first and "drop" in parts else None
        self.layers = nn.ModuleList(getattr(inner, parts["layers"])[i] for i in blocks)
        self.rotary = getattr(inner, parts["rotary"]) if "rotary" in parts else None
        self.norm = getattr(inner, parts["norm"]) if last else None
        self.head: Any = model.lm_head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x) if self.embed is not None else x
        length = hidden.shape[1]
        positions = torch.arange(length, device=hidden.device).unsqueeze(0)
        if self.positions is not None:
            hidden = hidden + self.positions(positions)
        if self.drop is not None:
            hidden = self.drop(hidden)
        mask = None if self.causal_by_flag else \
            torch.full((length, length), float("-inf"), device=hidden.device, dtype=hidden.dtype).triu(1)[None, None]
        rotary = self.rotary(hidden, positions) if self.rotary is not None else None
        for layer in self.layers:
            if rotary is not None:
                out = layer(hidden, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
            else:
                out = layer(hidden, None, mask, position_ids=positions)
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
    parts = split(len(blocks_of(model)), stages)
    return Stage(model, parts[index], index == 0, index == stages - 1)


def tied(model: nn.Module) -> list[nn.Parameter]:
    """Parameters the first stage and the last both hold (an output projection tied to the
    token embedding), which their stages must keep one."""
    if supported(model) is not None:
        return []
    first = stage(model, 0, 1)
    head = {id(p) for p in model.lm_head.parameters()}
    return [p for p in (first.embed.parameters() if first.embed is not None else []) if id(p) in head]


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


def padding_refused(batch: Any) -> str | None:
    """Why the stages cannot train this batch as the whole model would (``None``: they
    can): an ``attention_mask`` that masks anything (padding), which the stages' causal
    attention over whole sequences would ignore. Asked of the first batch only: it reads
    the mask (one device sync, in the warm-up)."""
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    if isinstance(mask, torch.Tensor) and not bool(mask.all()):
        return ("pipeline_parallel: this task's batches carry an attention_mask that masks padding, which the "
                "tuner's stages do not apply (causal attention over whole sequences); pack the sequences, or give "
                "the task a pipeline_split whose stages take the mask")
    return None


def target_ids(batch: Any) -> torch.Tensor:
    """What the last stage's loss compares with: ``labels`` where the batch has them."""
    if isinstance(batch, dict) and isinstance(batch.get("labels"), torch.Tensor):
        return batch["labels"]
    return input_ids(batch)
