"""Megatron-LM's tensor parallelism for transformers' ``Conv1D`` (GPT-2), by hand.

PyTorch's ``ColwiseParallel`` / ``RowwiseParallel`` take only ``nn.Linear`` and
``nn.Embedding``; GPT-2's projections are ``Conv1D`` (``y = x @ W + b``, ``W`` stored
``[in, out]``) and ``c_attn`` packs query, key and value. Each rank keeps plain local
parameters: colwise (``c_fc``, and ``c_attn`` by heads of each of q, k, v) its output
columns, its input through :class:`_CopyToGroup`; rowwise (``c_proj``) its input rows, the
partial outputs summed by :class:`_ReduceFromGroup` before the bias; the tied vocabulary
its rows (:class:`VocabEmbedding`, :class:`VocabHead`). Replicated parameters get the same
gradient on every rank, so they stay equal without a collective.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherLast(torch.autograd.Function):
    """Each rank's slice of the last dimension, gathered in rank order; the gradient split back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.width = group, dist.get_rank(group), x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width].contiguous(), None


class VocabEmbedding(nn.Module):
    """This rank's rows of the token embedding: lookups of other ranks' tokens read zero,
    and the ranks' lookups are summed (each token found on exactly one rank)."""

    def __init__(self, weight: nn.Parameter, start: int, group: Any) -> None:
        super().__init__()
        self.weight, self.start, self.group = weight, start, group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.start + self.weight.shape[0])
        local = torch.nn.functional.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        return _ReduceFromGroup.apply(local.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


class VocabHead(nn.Module):
    """This rank's rows of the output projection (its vocabulary's logits), gathered."""

    def __init__(self, weight: nn.Parameter, group: Any) -> None:
        super().__init__()
        self.weight, self.group = weight, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GatherLast.apply(torch.matmul(_CopyToGroup.apply(x, self.group), self.weight.t()), self.group)


class ColumnConv1D(nn.Module):
    """This rank's output columns of a ``Conv1D``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, group: Any) -> None:
        super().__init__()
        self.weight, self.bias, self.group = nn.Parameter(weight), nn.Parameter(bias), group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToGroup.apply(x, self.group)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class RowConv1D(nn.Module):
    """This rank's input rows of a ``Conv1D``; outputs summed over the group, then the bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, group: Any) -> None:
        super().__init__()
        self.weight, self.bias, self.group = nn.Parameter(weight), nn.Parameter(bias), group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = torch.mm(x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)
        return _ReduceFromGroup.apply(partial, self.group) + self.bias


def shard(model: nn.Module, group: Any, plan: dict[str, str]) -> None:
    """Replace each named ``Conv1D`` by this rank's part of it (styles: ``colwise_conv1d``,
    ``colwise_qkv``, ``rowwise_conv1d``)."""
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    named = dict(model.named_modules())
    shards: dict[int, nn.Parameter] = {}
    """The vocabulary's shard by the original weight: a tied embedding and head share one."""
    for name, style in plan.items():
        conv = named[name]
        weight = conv.weight.detach()
        bias = conv.bias.detach() if getattr(conv, "bias", None) is not None else None
        parent_name, _, attr = name.rpartition(".")
        parent = named[parent_name] if parent_name else model
        if style in ("vocab_embedding", "vocab_head"):
            rows = weight.shape[0] // tp
            if id(conv.weight) not in shards:
                shards[id(conv.weight)] = nn.Parameter(weight[rank * rows:(rank + 1) * rows].clone())
            shard_ = shards[id(conv.weight)]
            new: nn.Module = (VocabEmbedding(shard_, rank * rows, group) if style == "vocab_embedding"
                              else VocabHead(shard_, group))
            setattr(parent, attr, new)
            continue
        assert bias is not None
        if style == "rowwise_conv1d":
            rows = weight.shape[0] // tp
            new = RowConv1D(weight[rank * rows:(rank + 1) * rows].clone(), bias.clone(), group)
        elif style == "colwise_conv1d":
            cols = weight.shape[1] // tp
            part = slice(rank * cols, (rank + 1) * cols)
            new = ColumnConv1D(weight[:, part].clone(), bias[part].clone(), group)
        elif style == "colwise_qkv":
            width = weight.shape[1] // 3  # query | key | value, each the hidden size
            cols = width // tp
            pick = torch.cat([torch.arange(k * width + rank * cols, k * width + (rank + 1) * cols) for k in range(3)])
            new = ColumnConv1D(weight[:, pick].clone(), bias[pick].clone(), group)
            parent.split_size = cols  # type: ignore[assignment]  # the attention splits its local q | k | v
        else:
            raise ValueError(f"tensor-parallel style {style!r} is not one this module applies")
        setattr(parent, attr, new)
