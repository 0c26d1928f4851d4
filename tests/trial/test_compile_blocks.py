"""The compile lever compiles every block, torch's own modules too: ``Module.compile()`` on
``nn.Linear`` or ``nn.TransformerEncoderLayer`` compiled nothing (dynamo skips torch's own
frames), which an H200's acceptance found as ``compile_s`` 0."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from tuner.trial.engines.model_levers import compile_model, compiled_so_far, release_compiled, torchs_own_forward


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu()


class Renamed(nn.Linear):
    """A subclass that keeps torch's forward."""


BLOCKS = {"Linear": (lambda: nn.Linear(8, 8), True),
          "Sequential": (lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU()), True),
          "subclass": (lambda: Renamed(8, 8), True),
          "user block": (Block, False)}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_each_block_compiles_into_a_graph_whether_torchs_own_or_the_users(name):
    make, torchs = BLOCKS[name]
    block = make()
    eager = copy.deepcopy(block)
    assert torchs_own_forward(block) is torchs
    before = compiled_so_far()
    counters.clear()
    try:
        compile_model(block, [block])
        x = torch.randn(2, 8)
        out = block(x)
        out.sum().backward()
        assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
        torch.testing.assert_close(out, eager(x))
    finally:
        release_compiled(before)
