"""What the search measures next: a chain of proposers, then the sampler.

The method, in order (docs/search.md): the user's configuration first, the largest micro-batch
``tuner plan`` predicts to fit, then one change at a time from the best so far; when none of
these has anything to say, the study's sampler (TPE, with the memory budget as a constraint).
Each round the :class:`~tuner.tuning.decider.Decider` asks the chain: the first proposer with
a proposal has it enqueued in the study, and the study's next ``ask`` returns it (a proposal
is a trial of the study like any other, so the sampler learns from it). Changing the search
is writing one proposer and putting it in :func:`chain`. What a proposal may not do (run an
impossible layout, break the memory budget) is for the filters (:mod:`tuner.tuning.proposing.filters`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from tuner.tuning.events import Said
from tuner.tuning.proposing import guided

if TYPE_CHECKING:
    from tuner.analysis.diagnose import Verdict
    from tuner.study.searchspace import Space
    from tuner.study.trial_record import Record
    from tuner.study.workers import Workers


@dataclass(frozen=True)
class Proposal:
    """A configuration to measure next, and what the study records of why."""

    knobs: Mapping[str, Any]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    """``baseline``, or ``guided`` with ``why`` (the search log's "trial N: why")."""


@dataclass(frozen=True)
class Round:
    """What the proposers see of the study this round."""

    best: "Record | None"
    """The best feasible trial so far."""
    known: Mapping[tuple, "Record"]
    """Every configuration measured, by key."""
    taken: Callable[[Mapping[str, Any]], bool]
    """Whether knobs are measured already or another worker measures them now."""
    outcome: Callable[[Mapping[str, Any]], str | None]
    """The outcome knobs were recorded with, if measured."""


class Proposer(Protocol):
    def propose(self, now: Round) -> Proposal | None: ...


class Baseline:
    """The user's configuration: first, and again whenever nobody holds it (two workers that
    both withdrew from it, a withdrawal beside a dead worker's, left it to nobody)."""

    def __init__(self, knobs: Mapping[str, Any], claim: str, workers: "Workers") -> None:
        self.knobs, self.claim, self.workers = dict(knobs), claim, workers

    def propose(self, now: Round) -> Proposal | None:
        if self.workers.lost_baseline(self.claim, set(now.known)):
            return Proposal(self.knobs, {"baseline": True})
        return None


class PlanSeed:
    """Right after the baseline of a new study, the largest micro-batch ``tuner plan``'s
    profile predicts to fit the budget (the baseline's other knobs), once."""

    def __init__(self, knobs: Mapping[str, Any] | None, why: Said | None = None) -> None:
        self.knobs, self.why = (dict(knobs) if knobs is not None else None), why

    def propose(self, now: Round) -> Proposal | None:
        if self.knobs is None:
            return None
        knobs, self.knobs = self.knobs, None
        return Proposal(knobs, {"guided": True, "why": asdict(self.why) if self.why else None})


class GuidedWalk:
    """One change at a time from the best so far (:func:`tuner.tuning.proposing.guided.guided_next`),
    its order read from the best's verdicts."""

    def __init__(self, space: "Space",
                 verdicts: Callable[[dict[str, Any] | None, dict[str, Any] | None], Sequence["Verdict"]],
                 key_of: Callable[[Mapping[str, Any]], tuple] | None = None) -> None:
        self.space, self.verdicts, self.key_of = space, verdicts, key_of
        """``key_of``: the key of :attr:`Round.known` a configuration's knobs have."""

    def propose(self, now: Round) -> Proposal | None:
        if now.best is None or now.best.params is None or now.best.metrics is None:
            return None

        def rate(knobs: Mapping[str, Any]) -> float | None:
            seen = now.known.get(self.key_of(knobs)) if self.key_of is not None else None
            return (seen.metrics or {}).get("samples_per_s") if seen is not None else None

        step = guided.guided_next(self.space, now.best.params, now.best.metrics, now.taken,
                                  self.verdicts(now.best.params, now.best.metrics), now.outcome, rate)
        return Proposal(step.knobs, {"guided": True, "why": asdict(step.why)}) if step is not None else None


def first(proposers: Sequence[Proposer], now: Round) -> Proposal | None:
    """The chain's proposal this round (``None``: the sampler chooses)."""
    for proposer in proposers:
        proposal = proposer.propose(now)
        if proposal is not None:
            return proposal
    return None


def chosen_by(attrs: Mapping[str, Any]) -> "str | Said":
    """What chose a trial, for the search log: a guided step's verdict, the baseline, or TPE
    (a string: what the study's own layer wrote, a trial put back after its worker died)."""
    why = attrs.get("why")
    if isinstance(why, Mapping):
        return Said(why["code"], dict(why.get("figures") or {}))
    return why or Said("baseline" if attrs.get("baseline") else "sampler")
