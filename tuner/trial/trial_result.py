"""What a trial produced, and the one list of states a trial can end in (DESIGN.md, "Outputs")."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tuner.harness.metrics import Window
from tuner.inputs.plan import Plan


class State(str, enum.Enum):
    """How a trial ended. A ``str`` so that JSON, CSV and Optuna's user attributes hold the
    plain value (``"ok"``), and a state read back from them compares equal to the member."""

    OK = "ok"
    PRUNED = "pruned"
    """Cut short: clearly slower than the best so far."""
    OOM = "oom"
    NONFINITE = "nonfinite"
    """The loss became NaN or inf."""
    IMPRECISE = "imprecise"
    """Rejected by the precision guard (:mod:`tuner.analysis.guard`)."""
    OVER_BUDGET = "over_budget"
    """Ran, but its peak memory broke ``budget.memory_gib`` / ``host_memory_gib``."""
    SKIPPED = "skipped"
    """Predicted over the budget, not run."""
    HUNG = "hung"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    __hash__ = str.__hash__  # "ok" and State.OK are one key in a dict or a set


INFEASIBLE = frozenset({State.OOM, State.NONFINITE, State.OVER_BUDGET, State.IMPRECISE, State.SKIPPED})
"""Outcomes recorded as complete trials with the memory/precision constraint violated, so
the sampler learns to avoid the region (the others that are not ``ok`` are failures)."""

PruneRule = Callable[[Window], bool]
"""Given the steps measured so far (rank 0's window), whether to stop the trial now. A pure
function of the window: the measured loop touches no storage."""


@dataclass(frozen=True)
class Instruments:
    """Optional instruments for a trial a user wants to look inside."""

    trace_dir: Path | None = None
    """Write a ``torch.profiler`` trace of the measured window here (one file per rank),
    for chrome://tracing, Perfetto or TensorBoard."""
    nvtx: bool = False
    """NVTX ranges around data wait, forward, backward and optimizer step."""


@dataclass
class TrialResult:
    """What a trial produced. ``metrics`` is ``None`` unless ``state`` is ``ok``."""

    params: dict[str, Any]
    state: str
    """A :class:`State` value."""
    reason: str | None = None
    """Why it ended as it did, in the words of what stopped it (an exception, a script's error line)."""
    metrics: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds in ``build``, ``warmup``, ``measure`` and ``teardown``."""
    losses: list[float] = field(default_factory=list)
    """The global batch's loss per optimizer step (each rank's mean of its micro-batches,
    averaged over the ranks), warm-up included: what the precision guard compares with the
    fp32 reference."""
    notes: list[str] = field(default_factory=list)
    """What the user should know about this configuration (a loss that fell back)."""
    unmeasured: dict[str, str] = field(default_factory=dict)
    """Why each metric nothing could measure here is null, by name (the energy counter, a
    MIG slice's utilisation, a script's loop without a DataLoader)."""
    batch_norm: bool = False
    """The model holds BatchNorm layers: the micro-batch size changes what it learns."""
    pruned_at: tuple[int, float] | None = None
    """(measured steps, samples/s) where a pruned trial was cut, for the sampler (reported
    to Optuna after the trial, never from inside the measured loop)."""
    restart: str | None = None
    """Why this process can run no more trials after this one (:func:`tuner.trial.failures.poisons`)."""
    failure: dict[str, Any] | None = None
    """A script that exited before reporting, as data (:func:`tuner.scriptmode.launcher.exited`):
    its own ``error`` line (``None``: none found), its exit ``status``, the line of its own code
    the error came from (``at``), and where its whole ``output`` is."""
    ruled: dict[str, Any] | None = None
    """Where the tuner itself gave the state (the precision guard, an objective not measured, a
    lever's rule), why, as a record: ``{"code", "figures"}``, worded at the edges
    (:func:`tuner.outputs.trial_words.trial_reason`); ``reason`` then holds none."""
    ran: dict[str, Any] = field(default_factory=dict)
    """Levers left to the library (``default``) and what it actually ran, as the script's
    probe read them there (an HF Trainer's default optimizer is fused AdamW:
    ``{"optimizer_impl": "fused"}``): the diagnosis advises from these."""

    @classmethod
    def of(cls, plan: Plan, state: str, reason: str | None = None, **rest: Any) -> "TrialResult":
        """The result of a trial of ``plan``, its knobs recorded flat (:meth:`Plan.params`)."""
        return cls(plan.params(), state, reason, **rest)

    @staticmethod
    def ran_of(runs: "list[TrialResult]") -> dict[str, Any]:
        """What the library ran, as the first of ``runs`` that says so reported it."""
        return next((r.ran for r in runs if r.ran), {})

    @property
    def ok(self) -> bool:
        return self.state == State.OK

