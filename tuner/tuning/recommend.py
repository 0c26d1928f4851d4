"""The last word on the answer: each change in it kept or dropped by the one rule
(:mod:`tuner.stats.decision`), at the search's tolerance, and the result says which rule
decided with its interval.

After the confirmation and the attribution, each change of the answer is read from the
answer with that change put back (the attribution's leave-one-out, settled by
:func:`tuner.tuning.finalists.settle_changes`) against the *fastest* finalist: it is
dropped only when the interval shows that configuration costs less than the tolerance, it
ran fine every time, and it stays inside the budget, the precision guard and the space;
kept when the interval shows it costs more; otherwise kept, ``undecided``, with its
interval: a measured change leaves the answer only on evidence. Before this rule a change
was also dropped when its point estimate read as a loss while its interval still
straddled the tolerance: simulated, a real 10% gain was given back 14% of the time at 22%
noise a run, 12.5 points of it that way.

All the changes shown within the tolerance are dropped together, but only when the
answer without all of them is itself shown within the tolerance of the fastest (each alone
costing less than the tolerance does not make their sum so); otherwise the one whose
removal measured cheapest goes alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from tuner.analysis.guard import divergence
from tuner.config.space import KNOBS, Config, conflict, numerics
from tuner.stats import decision
from tuner.study import records as study_mod

if TYPE_CHECKING:
    from tuner.analysis.attribution import Attribution, Row
    from tuner.config.recipe import Budget, Recipe
    from tuner.study.searchspace import Space
    from tuner.trial.trial_result import TrialResult
    from tuner.tuning.finalists import Confirmation
    from tuner.tuning.pool import Pool


@dataclass
class Decision:
    """How the answer was decided (``best.json``'s ``decision``)."""

    params: dict[str, Any]
    tolerance: float
    rule: str
    """``fastest``, ``equivalent``, ``cap`` (the confirmation's :attr:`Confirmation.rule`),
    ``leave-one-out`` (changes dropped here), or ``search`` (no confirmation ran)."""
    knobs: list[dict[str, Any]] = field(default_factory=list)
    """One entry per change from the baseline: ``knob``, ``value``, ``kept``, ``label``
    (``kept``, ``dropped``, ``undecided``), ``slowdown`` without it (the interval's JSON, or
    None), ``text``."""
    notes: list[str] = field(default_factory=list)
    together: dict[str, Any] | None = None
    """The answer without every change shown cheap: ``knobs`` and its ``slowdown`` against
    the fastest, when there were several."""

    def to_json(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "rule": self.rule, "knobs": self.knobs, "notes": self.notes,
                "together": self.together}


def fastest_of(best: dict[str, Any], confirmed: "Confirmation | None") -> dict[str, Any]:
    """What every change is read against: the confirmation's fastest, else the answer."""
    return confirmed.fastest if confirmed is not None and confirmed.fastest else best


def droppable(best: dict[str, Any], fastest: dict[str, Any], attribution: "Attribution | None", pool: "Pool",
              baseline: dict[str, Any], make: Callable[[dict[str, Any]], Config], recipe: "Recipe",
              reference: list[float] | None, space: "Space") -> list[str]:
    """The changes whose removal the interval shows costs less than the tolerance."""
    return [e["knob"] for e in _judged(best, fastest, attribution, pool, baseline, make, recipe, reference, space)
            if e["label"] == "dropped"]


def together(best: dict[str, Any], knobs: list[str], baseline: dict[str, Any],
             make: Callable[[dict[str, Any]], Config]) -> dict[str, Any] | None:
    """The answer with every one of ``knobs`` (attribution steps, ``a+b`` for two) back at
    the baseline's values (``None``: no such configuration)."""
    names = [n for k in knobs for n in k.split("+")]
    values = {**{k: v for k, v in best.items() if k in KNOBS}, **{n: baseline[n] for n in names}}
    return None if conflict(values) is not None else make(values).params()


def decide(best: dict[str, Any], confirmed: "Confirmation | None", attribution: "Attribution | None",
           pool: "Pool", baseline: dict[str, Any], make: Callable[[dict[str, Any]], Config], recipe: "Recipe",
           reference: list[float] | None, space: "Space") -> Decision:
    """The answer and why: the confirmation's winner, less the changes the rule drops (all
    together where that is itself shown within the tolerance, else the cheapest alone)."""
    tolerance = recipe.tolerance
    fastest = fastest_of(best, confirmed)
    out = Decision(dict(best), tolerance, confirmed.rule if confirmed is not None else "search")
    out.knobs = _judged(best, fastest, attribution, pool, baseline, make, recipe, reference, space)
    drops = [e for e in out.knobs if e["label"] == "dropped"]
    chosen: list[dict[str, Any]] = []
    if len(drops) > 1:
        params = together(best, [e["knob"] for e in drops], baseline, make)
        s = pool.slowdown(fastest, params) if params is not None else None
        fine = params is not None and space.holds(params, recipe.world_size) and _fine(
            params, pool, recipe.budget, recipe.precision.tolerance, reference)
        call = decision.call(s, tolerance)
        out.together = {"knobs": [e["knob"] for e in drops], "slowdown": s.to_json() if s else None,
                        "dropped": fine and call.verdict == decision.DROP and call.decided}
        if out.together["dropped"]:
            assert params is not None and s is not None
            chosen, out.params = drops, params
            out.notes.append(f"recommending the answer without {', '.join(e['knob'] for e in drops)} together: "
                             f"{s.text()} against the fastest, below the {tolerance:.0%} tolerance")
    if drops and not chosen:
        cheapest = max(drops, key=lambda e: pool.entry(e["params"]).stats.mean)
        chosen, out.params = [cheapest], cheapest["params"]
        out.notes.append(f"recommending the answer without {cheapest['knob']}: " + cheapest["text"].split(": ", 1)[1])
        for e in drops:
            if e is not cheapest:
                e["kept"], e["label"] = True, "kept"
                e["text"] = (f"{e['knob']}={e['value']} kept: alone it costs less than the {tolerance:.0%} tolerance, "
                             "but the answer without it and the others was not shown to (one is dropped)")
    if chosen:
        out.rule = "leave-one-out"
    for e in out.knobs:
        e.pop("params", None)
    out.notes += [e["text"] for e in out.knobs if e["kept"]]
    return out


def _judged(best: dict[str, Any], fastest: dict[str, Any], attribution: "Attribution | None", pool: "Pool",
            baseline: dict[str, Any], make: Callable[[dict[str, Any]], Config], recipe: "Recipe",
            reference: list[float] | None, space: "Space") -> list[dict[str, Any]]:
    """Each change of the answer with the one rule's verdict on the answer without it."""
    tolerance = recipe.tolerance
    out: list[dict[str, Any]] = []
    for row in attribution.rows if attribution is not None else []:
        params = together(best, [row.knob], baseline, make)
        ok = params is not None and space.holds(params, recipe.world_size) and _fine(params, pool, recipe.budget,
                                                                                  recipe.precision.tolerance, reference)
        s = pool.slowdown(fastest, params) if params is not None else None
        value = row.after
        if not ok or s is None:
            why = "the answer without it was not measured fine" if not ok else "no noise measured to decide on"
            out.append({"knob": row.knob, "value": value, "kept": True, "label": "undecided", "slowdown": None,
                        "text": f"{row.knob}={value} kept: {why}"})
            continue
        call = decision.call(s, tolerance)
        entry = {"knob": row.knob, "value": value, "kept": call.verdict == decision.KEEP, "label": call.label,
                 "slowdown": s.to_json(), "params": params}
        if call.verdict == decision.DROP:
            entry["text"] = (f"{row.knob}={value} dropped: without it {s.text()} against the fastest, below the "
                             f"{tolerance:.0%} tolerance")
        elif call.decided:
            entry["text"] = f"{row.knob}={value} kept: {s.gain_text('than without it')}{_interaction(row)}"
        else:
            entry["text"] = (f"{row.knob}={value} kept, undecided: {s.gain_text('than without it')}; the interval "
                             f"straddles the {tolerance:.0%} tolerance at the cap, so the faster-measured answer "
                             "stays")
        out.append(entry)
    return out


def _fine(params: dict[str, Any], pool: "Pool", budget: "Budget", tolerance: float,
          reference: list[float] | None) -> bool:
    entry, metrics = pool.entry(params), pool.metrics(params)
    return not (metrics is None or entry.failures or study_mod.over_budget(metrics, budget) is not None
                or imprecise(params, entry.runs, reference, tolerance))


def _interaction(row: "Row") -> str:
    """A kept change that lost on its own step from the baseline: it pays only with the
    others (the knobs interact)."""
    if row.gain is not None and (row.mark == "loss" or (row.mark is None and row.gain < 1)):
        return (f" (on its own from the baseline it was a loss, {row.gain:.2f}x: it pays only together with the "
                "other changes, an interaction)")
    return ""


def imprecise(params: dict[str, Any], runs: "list[TrialResult]", reference: list[float] | None,
              tolerance: float) -> bool:
    """Whether any run of ``params`` left the fp32 reference curve beyond the precision ``tolerance``."""
    label = numerics(params)
    if label is None or not reference:
        return False
    ordered = params.get("in_order", True)
    return any(r.ok and divergence(r.losses, reference, tolerance, label, ordered) for r in runs)
