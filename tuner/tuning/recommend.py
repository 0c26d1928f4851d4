"""The last word on the answer: each change in it kept or dropped by one rule, at the
search's tolerance, and the result says which rule decided with its interval.

After the confirmation and the attribution, each change of the answer is read from the
answer with that change put back (the attribution's leave-one-out, settled by
:func:`tuner.tuning.finalists.settle`): it is dropped only when the upper 95% bound of
that configuration's slowdown against the *fastest* finalist is below the tolerance, it
ran fine every time, and it stays inside the budget, the precision guard and the space.
Against the fastest, never against an answer already simplified, so two drops cannot add
up to twice the tolerance. Otherwise the change is kept, with its measured gain and
interval ("amp_dtype=bf16 kept: 5.1% faster, 95% interval 3.9% to 6.3%"). Before this
rule a 16.4% measured gain was given back as "within the noise (±22% a run)" on timm's
train.py run unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from tuner.analysis.guard import divergence
from tuner.config.space import KNOBS, Config, conflict, numerics
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
    ``leave-one-out`` (a change dropped here), or ``search`` (no confirmation ran)."""
    knobs: list[dict[str, Any]] = field(default_factory=list)
    """One entry per change from the baseline: ``knob``, ``value``, ``kept``, ``slowdown``
    without it (the interval's JSON, or None), ``text``."""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "rule": self.rule, "knobs": self.knobs, "notes": self.notes}


def decide(best: dict[str, Any], confirmed: "Confirmation | None", attribution: "Attribution | None",
           pool: "Pool", baseline: dict[str, Any], make: Callable[[dict[str, Any]], Config], recipe: "Recipe",
           reference: list[float] | None, space: "Space") -> Decision:
    """The answer and why: the confirmation's winner, less the one change whose removal
    costs least when that is shown below the tolerance, or when the answer without it
    measured faster (a change measured as a loss is never given; see the module's docstring)."""
    tolerance = recipe.tolerance
    fastest = (confirmed.fastest if confirmed is not None and confirmed.fastest else best)
    out = Decision(dict(best), tolerance, confirmed.rule if confirmed is not None else "search")
    droppable: list[tuple[float, str, dict[str, Any]]] = []
    for row in attribution.rows if attribution is not None else []:
        params = _without(best, row.knob, baseline, make)
        ok = params is not None and space.holds(params, recipe.world_size) and _fine(params, pool, recipe.budget,
                                                                                  recipe.precision.tolerance, reference)
        s = pool.slowdown(fastest, params) if params is not None else None
        value = row.after
        if not ok or s is None:
            why = "the answer without it was not measured fine" if not ok else "no noise measured to decide on"
            out.knobs.append({"knob": row.knob, "value": value, "kept": True, "slowdown": None,
                              "text": f"{row.knob}={value} kept: {why}"})
            continue
        goes = s.within(tolerance) or s.estimate < 0  # shown cheap, or a loss: without it is the faster
        entry = {"knob": row.knob, "value": value, "kept": not goes, "slowdown": s.to_json()}
        if goes:
            why = ("the change measured as a loss: the simpler configuration is the faster" if s.estimate < 0
                   else f"below the {tolerance:.0%} tolerance")
            entry["text"] = f"{row.knob}={value} may go: without it {s.text()} against the fastest, {why}"
            droppable.append((pool.median(params) or 0.0, row.knob, params))
        else:
            entry["text"] = f"{row.knob}={value} kept: {s.gain_text('than without it')}{_interaction(row)}"
        out.knobs.append(entry)
    if droppable:
        _, knob, params = max(droppable, key=lambda d: d[0])
        out.params, out.rule = params, "leave-one-out"
        for entry in out.knobs:
            if entry["knob"] == knob:
                entry["text"] = entry["text"].replace(" may go:", " dropped:")
            elif not entry["kept"]:
                entry["kept"] = True
                entry["text"] = entry["text"].replace(" may go:", " kept (one change is dropped at a time; this one "
                                                      "was read against the answer before that drop):")
        out.notes.append(f"recommending the answer without {knob}: " + next(
            e["text"].split(": ", 1)[1] for e in out.knobs if e["knob"] == knob))
    out.notes += [e["text"] for e in out.knobs if e["kept"]]
    return out


def _without(best: dict[str, Any], knob: str, baseline: dict[str, Any],
             make: Callable[[dict[str, Any]], Config]) -> dict[str, Any] | None:
    """The answer with one attribution step's knobs back at the baseline's values."""
    knobs = {**{k: v for k, v in best.items() if k in KNOBS}, **{k: baseline[k] for k in knob.split("+")}}
    return None if conflict(knobs) is not None else make(knobs).params()


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
