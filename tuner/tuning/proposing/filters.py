"""What stands between a proposal and a measurement, and between a measurement and a result.

A trial asked of the study passes :func:`skip_reason` before it runs: a configuration whose
layout or levers cannot run here is refused with its rule, one the memory model is sure would
break the budget is skipped (both recorded ``skipped``, never run; the baseline always runs,
it is what is compared with). After it ran, :class:`PrecisionGuard` turns a trial whose loss
curve left the fp32 reference into ``imprecise``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tuner.analysis.guard import divergence
from tuner.inputs.space import numerics
from tuner.trial.trial_result import State
from tuner.tuning.events import Said

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Recipe
    from tuner.memory.model import MemoryModel
    from tuner.study.searchspace import Space
    from tuner.study.study import Asked
    from tuner.study.trial_record import Record
    from tuner.trial.trial_result import TrialResult


def refused(space: "Space", recipe: "Recipe", config: "Plan") -> dict[str, Any] | None:
    """Why ``config`` cannot run at all (its layout, one of its levers' rules), if it cannot:
    ``refused`` with the ``rule`` in its own words."""
    why = space.refusal(config, recipe.global_batch_size)
    return {"code": "refused", "figures": {"rule": why}} if why is not None else None


def over_memory(memory: "MemoryModel | None", recipe: "Recipe", config: "Plan", trial: "Asked"
                ) -> dict[str, Any] | None:
    """Why the memory model skips ``config`` (sure enough it would break the budget), if it
    does: ``over_memory`` with the model's own words (``why``); the prediction is written on
    the trial either way, for trials.csv and the report."""
    if memory is None:
        return None
    predicted = memory.predict(config)
    trial.set("predicted_peak_gib", predicted.peak_gib)
    trial.set("prediction", predicted.basis)
    why = memory.skip_reason(predicted, recipe.budget.memory_gib)
    if why is None or not recipe.budget.skip or trial.attrs.get("baseline"):
        return None
    return {"code": "over_memory", "figures": {"why": why}}


def skip_reason(space: "Space", memory: "MemoryModel | None", recipe: "Recipe", config: "Plan",
                trial: "Asked") -> dict[str, Any] | None:
    """Why the asked trial is recorded ``skipped`` instead of run, as a record (``None``: it runs)."""
    return refused(space, recipe, config) or over_memory(memory, recipe, config, trial)


class PrecisionGuard:
    """The fp32 reference loss curve, and the trials that change the arithmetic held to it
    (:func:`tuner.analysis.guard.divergence`)."""

    def __init__(self, tolerance: float, reference: list[float] | None = None) -> None:
        self.tolerance = tolerance
        self.reference = reference
        """The reference loss per step (fp32, eager): ``None`` until one is measured, ``[]``
        when it could not be (trials are then not checked)."""

    def needs_reference(self, config: "Plan") -> bool:
        """Whether ``config`` changes the arithmetic with no reference yet: an fp32 trial
        runs first (only where the batches come in order)."""
        return numerics(config) is not None and self.reference is None

    def set_reference(self, result: "TrialResult") -> Said:
        """Take the extra reference trial's curve; returns what to say about it."""
        if result.ok and result.losses:
            self.reference = result.losses
            return Said("reference_measured")
        self.reference = []
        return Said("reference_failed", {"state": result.state, "reason": result.reason})

    def judge(self, result: "TrialResult", config: "Plan") -> "TrialResult":
        """``result``, or ``imprecise`` when its curve left the reference; an fp32 eager trial
        in order is itself the reference when there is none yet."""
        label = numerics(config)
        if result.ok and label is None and not self.reference and result.losses and config.in_order:
            self.reference = result.losses
        elif result.state in (State.OK, State.PRUNED) and label is not None and self.reference and result.losses:
            # a pruned trial whose curve already left the reference is imprecise, not just slow
            why = divergence(result.losses, self.reference, self.tolerance, label, config.in_order)
            if why:
                return dataclasses.replace(result, state=State.IMPRECISE, reason=None, ruled=why)
        return result


def first_losses(records: "list[Record]") -> list[float] | None:
    """A resumed study's reference curve: the losses of its first fp32 eager feasible trial."""
    return next((t.get("losses") for t in records if numerics(t.params) is None and t.get("losses")), None)
