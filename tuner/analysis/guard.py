"""The precision guard: a faster configuration must still train the same model.

Every trial starts from the same weights (the recipe's seed) and reads the same samples
in the same order at every step, whatever its micro-batch, workers or ZeRO stage, so its
loss per optimizer step follows the same curve up to rounding. A bf16/fp16 configuration
whose curve leaves the fp32 one by more than the recipe's ``precision.tolerance``
(relative, at any step) is rejected however fast it was (state ``imprecise``): reduced precision is then
changing what the model learns. Non-finite losses are rejected first (``nonfinite``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence


def divergence(losses: Sequence[float], reference: Sequence[float], tolerance: float, amp: str,
               ordered: bool = True) -> dict[str, Any] | None:
    """Why ``losses`` are not close enough to the fp32 ``reference``, as a record (``None``:
    they are): ``nonfinite`` (at ``step``), ``mean_apart`` (out of order: the means over ``n``
    steps), ``apart`` (at ``step``), each with the figures its words need
    (:data:`tuner.outputs.trial_words.TRIAL`).

    Steps are compared one by one over the steps both ran (warm-ups differ in length). A
    configuration whose loader hands batches over out of order (``in_order: false``) meets
    the same batches in another order, so step k is not the reference's step k: its mean
    loss over the steps both ran is compared instead, with the same tolerance."""
    for step, loss in enumerate(losses, start=1):
        if not math.isfinite(loss):
            return {"code": "nonfinite", "figures": {"amp": amp, "step": step}}
    if not ordered:
        n = min(len(losses), len(reference))
        if n == 0:
            return None
        mean, ref = sum(losses[:n]) / n, sum(reference[:n]) / n
        gap = abs(mean - ref) / max(abs(ref), 1e-12)
        if gap > tolerance:
            return {"code": "mean_apart", "figures": {"amp": amp, "loss": mean, "steps": n, "gap": gap,
                                                      "reference": ref, "tolerance": tolerance}}
        return None
    for step, (loss, ref) in enumerate(zip(losses, reference), start=1):
        gap = abs(loss - ref) / max(abs(ref), 1e-12)
        if gap > tolerance:
            return {"code": "apart", "figures": {"amp": amp, "loss": loss, "step": step, "gap": gap,
                                                 "reference": ref, "tolerance": tolerance}}
    return None
