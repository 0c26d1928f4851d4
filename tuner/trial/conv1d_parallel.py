"""Megatron-LM's tensor parallelism for transformers' ``Conv1D`` (GPT-2), by hand.

PyTorch's ``ColwiseParallel`` / ``RowwiseParallel`` accept only ``nn.Linear`` and
``nn.Embedding``; GPT-2's projections are ``Conv1D`` (``y = x @ W + b`` with ``W`` stored
``[in, out]``), and its ``c_attn`` packs query, key and value side by side. Each rank keeps
plain local parameters, as Megatron-LM does:

- colwise (``c_fc``): its slice of ``W``'s output columns and of the bias; its input goes
  through :class:`_CopyToGroup` (identity forward, gradient all-reduced backward: every
  rank's slice contributed to the input's gradient);
- colwise packed (``c_attn``): its heads' columns of each of query, key and value, laid
  side by side, and the attention's ``split_size`` cut to match (the attention finds its
  head count from the width, ``view(..., -1, head_dim)``);
- rowwise (the ``c_proj`` s): its slice of ``W``'s input rows; the partial outputs are
  summed by :class:`_ReduceFromGroup` (all-reduce forward, identity backward) before the
  bias, which every rank holds whole (so it is added once).

Replicated parameters (biases of the rowwise projections, the norms, the embeddings) get
the same gradient on every rank of the group, so they stay equal without a collective.
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
    for name, style in plan.items():
        conv = named[name]
        weight, bias = conv.weight.detach(), conv.bias.detach()
        parent_name, _, attr = name.rpartition(".")
        parent = named[parent_name]
        if style == "rowwise_conv1d":
            rows = weight.shape[0] // tp
            new: nn.Module = RowConv1D(weight[rank * rows:(rank + 1) * rows].clone(), bias.clone(), group)
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
