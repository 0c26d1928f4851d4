"""The answer as the finish decided it, as ``best.json``'s ``decision``: each change from the
baseline with the one rule's verdict on the answer without it, against the finish's reference
(:mod:`tuner.tuning.finish`), its interval and a reason code; :mod:`tuner.outputs.wording`
says it.

- ``kept``: the interval shows the answer without it slower than the reference by more than
  the tolerance: a gain, on evidence.
- ``undecided``: neither shown; it stays where the finish's own paired runs measured it
  faster, and leaves (``measured_slower``) where they measured it slower; the summary says
  how much of the speedup rests on the undecided changes that stay.
- ``dropped``: the interval showed the answer without it within the tolerance of the
  reference (or, for a lever whose point is memory, it was not shown a gain).

Where the attribution's one-at-a-time step from the baseline and this verdict disagree in
sign, the entry holds both figures (``interaction``): the knobs interact (bf16 loses at the
baseline's micro-batch and wins at the answer's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from tuner.analysis import attribution as attribution_mod
from tuner.analysis.guard import divergence
from tuner.inputs.space import numerics
from tuner.stats import decision
from tuner.study import records as study_mod
from tuner.tuning.finish import ANSWER_PAIRS

if TYPE_CHECKING:
    from tuner.analysis.attribution import Attribution, Row
    from tuner.inputs.recipe import Recipe
    from tuner.stats.interval import Slowdown
    from tuner.study.searchspace import Space
    from tuner.trial.trial_result import TrialResult
    from tuner.tuning.finish import Finished
    from tuner.tuning.pool import Pool


@dataclass
class Decision:
    """How the answer was decided (``best.json``'s ``decision``)."""

    params: dict[str, Any]
    tolerance: float
    rule: str
    """``reference`` (the reference stands whole), ``simpler`` (changes dropped from it),
    ``faster`` (the finish found a configuration faster than the search's pick), or
    ``search`` (no finish ran: the best search trial)."""
    knobs: list[dict[str, Any]] = field(default_factory=list)
    """One entry per change from the baseline: ``knob``, ``value``, ``kept``, ``label``
    (``kept``, ``dropped``, ``undecided``), ``reason`` (:data:`tuner.tuning.summary.REASONS`),
    ``slowdown`` without it (the interval's JSON, or None); ``needed`` (why the answer without
    it is ruled out), ``held`` (:func:`_held`: why a change shown cheap stayed) and
    ``interaction`` (``alone``, ``together``: its gain one at a time from the baseline and in
    the answer, of opposite signs) where they apply."""
    moves: list[dict[str, Any]] = field(default_factory=list)
    """What the finish moved, in order (:attr:`tuner.tuning.finish.Finished.moves`)."""
    open: list[dict[str, Any]] = field(default_factory=list)
    """The questions the finish left open at its end (:func:`tuner.tuning.finish.open_record`)."""
    out_of_reach: bool = False
    """They were left since settling them would take more rounds than the budget holds."""
    reference: dict[str, Any] | None = None
    rounds: int = 0
    finish_s: float | None = None
    budget_s: float | None = None
    undecided_gain: float | None = None
    """The part of the speedup that rests on undecided changes (their point estimates
    multiplied; 1.0: none)."""
    rests_on: list[str] = field(default_factory=list)
    """The undecided changes that part rests on (those measured as gains)."""

    def to_json(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "rule": self.rule, "knobs": self.knobs, "moves": self.moves,
                "open": self.open, "out_of_reach": self.out_of_reach, "reference": self.reference,
                "rounds": self.rounds, "finish_s": self.finish_s, "budget_s": self.budget_s,
                "undecided_gain": self.undecided_gain, "rests_on": self.rests_on}


def record(best: dict[str, Any], finished: "Finished | None", attribution: "Attribution | None", pool: "Pool",
           baseline: dict[str, Any], tolerance: float, make: Callable[[dict[str, Any]], dict[str, Any]],
           valid: "attribution_mod.Valid | None" = None, speedup: float | None = None,
           ruled_out: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda p: None) -> Decision:
    """The answer and why: each change's verdict, the drops, the open questions, the part of
    the speedup that rests on undecided changes. A change without which the answer is ruled out
    by its own runs (``ruled_out``: over the memory budget, failed) is ``kept`` as needed,
    whatever its speed."""
    if finished is None:
        out = Decision(dict(best), tolerance, "search")
        out.knobs = [{"knob": step, "value": attribution_mod.values(best, step), "kept": True,
                      "label": "undecided", "reason": "no_finish", "slowdown": None}
                     for step, _ in attribution_mod.leave_one_out(baseline, best, valid)]
        return out
    reference = finished.reference
    rule = "simpler" if finished.dropped else "reference"
    if finished.faster:
        rule = "faster" if not finished.dropped else "simpler"
    out = Decision(dict(best), tolerance, rule, reference=dict(reference), rounds=finished.rounds,
                   finish_s=finished.seconds, budget_s=finished.budget_s, open=list(finished.open),
                   moves=list(finished.moves), out_of_reach=finished.out_of_reach and not finished.out_of_budget)
    rows = {r.knob: r for r in attribution.rows} if attribution is not None else {}
    gains: list[tuple[str, float]] = []
    # Each change is judged in the answer the user pastes. After a drop the reference still
    # holds the dropped change: a BERT script's micro-batch read "2.2% slower than without it"
    # against the reference with its 2 workers, in an answer without them that the same run
    # measured 1.10x the baseline on that one change.
    against = finished.answer if pool.entry(finished.answer).rates else reference
    for step, knobs in attribution_mod.leave_one_out(baseline, best, valid):
        without = make(knobs)
        s = pool.slowdown(against, without)
        value = attribution_mod.values(best, step)
        call = decision.call(s, tolerance)
        entry = {"knob": step, "value": value, "kept": True, "label": call.label if s is not None else "undecided",
                 "slowdown": s.to_json() if s is not None else None,
                 "trials": {"with": list(pool.entry(against).trials), "without": list(pool.entry(without).trials)}}
        why = ruled_out(without)
        if why is not None:
            out.knobs.append(entry | {"label": "kept", "reason": "needed", "needed": why})
            continue
        if s is None:
            entry["reason"] = "no_interval"
        elif call.decided and call.verdict == decision.KEEP:
            entry["reason"] = "gain"
        elif call.decided:  # shown cheap in the answer, yet the finish kept it: why, not "kept: 2% slower"
            entry["label"], entry["reason"] = decision.UNDECIDED, "unproven_drop"
            entry["held"] = _held(s, pool, reference, against, without)
        else:
            entry["reason"] = "straddles"
            # a gain as printed, 1.01x or more: nanoGPT's "1.00x of the answer's 1.18x rests on" said nothing
            ratio = 1 + s.gains[0]
            if 0 < s.estimate < 1 and round(ratio, 2) > 1.0:
                gains.append((step, ratio))
        interaction = _interaction(rows.get(step), s)
        out.knobs.append(entry | ({"interaction": interaction} if interaction else {}))
    for d in finished.dropped:
        label = decision.UNDECIDED if d["reason"] == "measured_slower" else "dropped"
        out.knobs.append({"knob": d["step"], "value": d["value"], "kept": False, "label": label,
                          "reason": d["reason"], "slowdown": d["slowdown"]})
    out.undecided_gain = math.prod(g for _, g in gains) if gains else 1.0
    out.rests_on = [step for step, _ in gains]
    return out


def _interaction(row: "Row | None", s: "Slowdown | None") -> dict[str, float] | None:
    """Where the step from the baseline and the verdict on the answer disagree in sign, both
    gains (``alone``, ``together``): its worth depends on the other changes."""
    if row is None or row.gain is None or s is None:
        return None
    together = 1 / (1 - s.estimate) if s.estimate < 1 else math.inf
    return {"alone": row.gain, "together": together} if (row.gain < 1) != (together < 1) else None


def answerable(params: dict[str, Any], pool: "Pool", recipe: "Recipe", reference: list[float] | None,
               space: "Space") -> bool:
    """Whether ``params`` may be the answer: in the space, every run fine, inside the budget
    and the precision guard."""
    return (space.holds(params, recipe.world_size) and pool.metrics(params) is not None
            and ruled_out(params, pool, recipe, reference) is None)


def ruled_out(params: dict[str, Any], pool: "Pool", recipe: "Recipe",
              reference: list[float] | None) -> dict[str, Any] | None:
    """Why its runs rule a configuration out of the answer, as a record: ``failed`` (with
    ``failures`` of ``runs``), ``over_budget`` (``over``: which limit, by how much) or
    ``imprecise`` (off the fp32 curve beyond ``tolerance``); ``None`` when it may be the answer,
    or was never measured. The finish asks nothing more of a question whose simpler side is
    ruled out, and the decision says the change is ``needed``."""
    entry, metrics = pool.entry(params), pool.metrics(params)
    if not entry.runs:
        return None
    if entry.failures:
        return {"code": "failed", "failures": entry.failures, "runs": len(entry.runs)}
    if metrics is None:
        return None
    over = study_mod.over_budget(metrics, recipe.budget)
    if over is not None:
        return {"code": "over_budget", "over": over[1]}
    if imprecise(params, entry.runs, reference, recipe.precision.tolerance):
        return {"code": "imprecise", "tolerance": recipe.precision.tolerance}
    return None


def imprecise(params: dict[str, Any], runs: "list[TrialResult]", reference: list[float] | None,
              tolerance: float) -> bool:
    """Whether any run of ``params`` left the fp32 reference curve beyond the precision ``tolerance``."""
    label = numerics(params)
    if label is None or not reference:
        return False
    ordered = params.get("in_order", True)
    return any(r.ok and divergence(r.losses, reference, tolerance, label, ordered) for r in runs)


def _held(s: "Slowdown", pool: "Pool", reference: dict[str, Any], answer: dict[str, Any],
          without: dict[str, Any]) -> dict[str, Any]:
    """Why the finish kept a change shown within the tolerance in the answer: a drop also needs
    the answer without it shown within the tolerance of the ``reference`` (its interval there),
    and :data:`~tuner.tuning.finish.ANSWER_PAIRS` ``pairs``; else the ``guard`` ruled it out."""
    if reference != answer:
        against = pool.slowdown(reference, without)
        return {"code": "reference", "slowdown": against.to_json() if against is not None else None}
    if s.pairs < ANSWER_PAIRS:
        return {"code": "pairs", "pairs": ANSWER_PAIRS}
    return {"code": "guard"}
