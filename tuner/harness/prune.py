"""The prune rule: cut a trial whose measured steps run far below the best so far.

One rule for both places a trial runs: the tuner's own loop and a script's ``tuner.Probe``
(the rule travels in the trial file as two numbers, so the script applies the very rule
the search would). It is asked early and then more and more sparsely (:func:`checks`) on
the steps the device has finished, and its bar rises with the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tuner.harness.metrics import Window, window_rate

PRUNE_BELOW = 0.5
"""A trial whose measured steps run below this fraction of the best so far is cut."""
EARLY_BAR = {2: 1 / 3, 3: 0.4}
"""The bar on the first few measured steps, lower because two steps are weak evidence: a
trial three times slower than the best after two steps need not run twelve."""


@dataclass(frozen=True)
class PruneBar:
    """Cut when samples/s over the window so far is below ``best`` x the bar."""

    best: float
    """The best rate so far (samples/s, all ranks)."""
    world_size: int

    def __call__(self, window: Window) -> bool:
        bar = EARLY_BAR.get(len(window.step_times), PRUNE_BELOW)
        return window_rate(window, self.world_size) < self.best * bar

    def to_json(self) -> dict[str, Any]:
        return {"best": self.best, "world_size": self.world_size}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PruneBar":
        return cls(float(data["best"]), int(data["world_size"]))


def checks(most: int) -> frozenset[int]:
    """Measured step counts at which the rule is asked: early and then more and more
    sparsely (2, 3, 4, 6, 9, 13, ...), up to half the window; the bar rises with the
    evidence. Asked once, after a quarter of the window, pruned trials cost more than
    finished ones on the issue's job (7-8 s against 3-5 s): they ran their slow steps until
    then."""
    out, n = set(), 2
    while n <= max(2, most // 2):
        out.add(n)
        n = max(n + 1, n * 3 // 2)
    return frozenset(out)
