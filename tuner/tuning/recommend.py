"""The answer as the finish decided it, in words and in ``best.json``'s ``decision``: each
change from the baseline with the one rule's verdict on the answer without it, against the
finish's reference (:mod:`tuner.tuning.finish`), and its interval.

- ``kept``: the interval shows the answer without it slower than the reference by more than
  the tolerance: a gain, on evidence.
- ``undecided``: neither shown; it stays (a change the search measured leaves only on
  evidence), and the summary says how much of the speedup rests on such changes.
- ``dropped``: the interval showed the answer without it within the tolerance of the
  reference (or, for a lever whose point is memory, it was not shown a gain).

Where the attribution's one-at-a-time step from the baseline and this verdict disagree in
sign, one line says both figures and why both are true: the knobs interact (bf16 loses at the
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
from tuner.tuning.finish import ANSWER_PAIRS, open_text

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
    ``slowdown`` without it (the interval's JSON, or None), ``text``."""
    notes: list[str] = field(default_factory=list)
    open: list[dict[str, Any]] = field(default_factory=list)
    """The questions the finish left open at its end (:func:`tuner.tuning.finish.open_record`)."""
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
        return {"tolerance": self.tolerance, "rule": self.rule, "knobs": self.knobs, "notes": self.notes,
                "open": self.open, "reference": self.reference, "rounds": self.rounds, "finish_s": self.finish_s,
                "budget_s": self.budget_s, "undecided_gain": self.undecided_gain, "rests_on": self.rests_on}


def rests_on(gain: float, speedup: float, steps: list[str]) -> str:
    """How much of the answer's speedup rests on undecided changes. Measured together in the
    answer they can exceed the whole speedup (a decided change costs, or they interact), and
    then it says all."""
    share, together = f"{gain:.2f}x of the answer's {speedup:.2f}x", ""
    if gain >= speedup:
        share, together = f"all of the answer's {speedup:.2f}x", f"; in the answer they measured {gain:.2f}x"
    return (f"{share} rests on change(s) the rule has not shown to be gains: {', '.join(steps)} "
            f"(undecided, kept{together})")


def record(best: dict[str, Any], finished: "Finished | None", attribution: "Attribution | None", pool: "Pool",
           baseline: dict[str, Any], tolerance: float, make: Callable[[dict[str, Any]], dict[str, Any]],
           valid: "attribution_mod.Valid | None" = None, speedup: float | None = None,
           ruled_out: Callable[[dict[str, Any]], str | None] = lambda p: None) -> Decision:
    """The answer and why: each change's verdict, the drops, the open questions, one line for
    the speedup's undecided part. A change without which the answer is ruled out by its own
    runs (``ruled_out``: over the memory budget, failed) is ``kept`` as needed, whatever its speed."""
    if finished is None:
        out = Decision(dict(best), tolerance, "search")
        out.notes.append("no finish ran: the answer is the best search trial, each of its changes undecided")
        out.knobs = [{"knob": step, "value": (value := attribution_mod.values(best, step)), "kept": True,
                      "label": "undecided", "reason": "no_finish", "slowdown": None,
                      "text": f"{step}={value} kept, undecided: no finish measured it"}
                     for step, _ in attribution_mod.leave_one_out(baseline, best, valid)]
        return out
    reference = finished.reference
    rule = "simpler" if finished.dropped else "reference"
    if finished.faster:
        rule = "faster" if not finished.dropped else "simpler"
    out = Decision(dict(best), tolerance, rule, reference=dict(reference), rounds=finished.rounds,
                   finish_s=finished.seconds, budget_s=finished.budget_s, open=list(finished.open))
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
                 "slowdown": s.to_json() if s is not None else None}
        why = ruled_out(without)
        if why is not None:
            entry |= {"label": "kept", "reason": "needed", "needed": why,
                      "text": f"{step}={value} kept, needed: the answer without it {why}"}
            out.knobs.append(entry)
            continue
        if s is None:
            entry["reason"] = "no_interval"
            entry["text"] = f"{step}={value} kept, undecided: the answer without it has no interval"
        elif call.decided and call.verdict == decision.KEEP:
            entry["reason"] = "gain"
            entry["text"] = f"{step}={value} kept: {s.gain_text('than without it')}, {s.counted}"
        elif call.decided:  # shown cheap in the answer, yet the finish kept it: say why, not "kept: 2% slower"
            entry["label"], entry["reason"] = decision.UNDECIDED, "unproven_drop"
            why = _not_dropped(s, pool, reference, against, without)
            entry["text"] = (f"{step}={value} kept, undecided: {s.gain_text('than without it')}, {s.counted}, "
                             f"within the {tolerance:.0%} tolerance; {why}")
        else:
            entry["reason"] = "straddles"
            entry["text"] = (f"{step}={value} kept, undecided: {s.gain_text('than without it')}, {s.counted}; "
                             f"the interval straddles the {tolerance:.0%} tolerance, and a change the search "
                             "measured leaves the answer only on evidence")
            # a gain as printed, 1.01x or more: nanoGPT's "1.00x of the answer's 1.18x rests on" said nothing
            ratio = 1 + s.gains[0]
            if 0 < s.estimate < 1 and round(ratio, 2) > 1.0:
                gains.append((step, ratio))
        entry["text"] += _interaction(rows.get(step), s)
        out.knobs.append(entry)
    for d in finished.dropped:
        out.knobs.append({"knob": d["step"], "value": d["value"], "kept": False, "label": "dropped",
                          "reason": d["reason"], "slowdown": d["slowdown"], "text": d["text"]})
    out.undecided_gain = math.prod(g for _, g in gains) if gains else 1.0
    out.rests_on = [step for step, _ in gains]
    if gains and speedup:
        out.notes.append(rests_on(out.undecided_gain, speedup, [step for step, _ in gains]))
    out.notes += finished.moves
    out.notes += [e["text"] for e in out.knobs if e["label"] != "dropped"]
    if finished.open:
        budget = f"{finished.budget_s:.0f} s" if finished.budget_s is not None else "its rounds"
        when = (f", since settling them would take more rounds than the finish's budget ({budget}) holds"
                if finished.out_of_reach and not finished.out_of_budget
                else f" when the finish's budget ({budget}) ended")
        out.notes.append(f"left open{when}: " + "; ".join(open_text(q) for q in finished.open))
    return out


def _interaction(row: "Row | None", s: Any) -> str:
    """Where the step from the baseline and the verdict on the answer disagree in sign: both
    figures and why both are true."""
    if row is None or row.gain is None or s is None:
        return ""
    alone = row.gain
    with_others = 1 / (1 - s.estimate) if s.estimate < 1 else math.inf
    if (alone < 1) == (with_others < 1):
        return ""
    return (f" (one at a time from the baseline it measured {alone:.2f}x, in the answer {with_others:.2f}x: its worth "
            "depends on the other changes, an interaction)")


def answerable(params: dict[str, Any], pool: "Pool", recipe: "Recipe", reference: list[float] | None,
               space: "Space") -> bool:
    """Whether ``params`` may be the answer: in the space, every run fine, inside the budget
    and the precision guard."""
    return (space.holds(params, recipe.world_size) and pool.metrics(params) is not None
            and ruled_out(params, pool, recipe, reference) is None)


def ruled_out(params: dict[str, Any], pool: "Pool", recipe: "Recipe", reference: list[float] | None) -> str | None:
    """Why a configuration its runs have ruled out may not be the answer, as a predicate ("is
    over the memory budget (...)"); ``None`` when it may, or when it was never measured.

    The finish asks nothing more of a question whose simpler side is ruled out, and the
    decision says the change is needed: the activations job's answer (micro-batch 256 with
    checkpointing) spent two finish rounds measuring 256 without checkpointing, over the
    budget in its search trial, and read the checkpointing "kept, undecided"."""
    entry, metrics = pool.entry(params), pool.metrics(params)
    if not entry.runs:
        return None
    if entry.failures:
        return f"failed in {entry.failures} of its {len(entry.runs)} run(s)"
    if metrics is None:
        return None
    over = study_mod.over_budget(metrics, recipe.budget)
    if over is not None:
        return f"is over the memory budget ({over[1]})"
    if imprecise(params, entry.runs, reference, recipe.precision.tolerance):
        return f"left the fp32 loss curve beyond the {recipe.precision.tolerance:g} precision tolerance"
    return None


def imprecise(params: dict[str, Any], runs: "list[TrialResult]", reference: list[float] | None,
              tolerance: float) -> bool:
    """Whether any run of ``params`` left the fp32 reference curve beyond the precision ``tolerance``."""
    label = numerics(params)
    if label is None or not reference:
        return False
    ordered = params.get("in_order", True)
    return any(r.ok and divergence(r.losses, reference, tolerance, label, ordered) for r in runs)


def _not_dropped(s: "Slowdown", pool: "Pool", reference: dict[str, Any], answer: dict[str, Any],
                 without: dict[str, Any]) -> str:
    """Why the finish kept a change shown within the tolerance in the answer: a drop also needs
    the answer without it shown within the tolerance of the reference, and two pairs: a change
    shown cheap in the answer but not against the reference is kept, and says why."""
    if reference != answer:
        against = pool.slowdown(reference, without)
        shown = against.text() if against is not None else "no interval"
        return (f"a drop needs the answer without it within the tolerance of the reference too, where it is "
                f"{shown}")
    if s.pairs < ANSWER_PAIRS:
        return f"a drop needs {ANSWER_PAIRS} pairs of its own"
    return "the answer without it did not pass the precision or memory guard"
