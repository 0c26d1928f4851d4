"""The last word on the answer: a change that buys nothing measurable is not recommended.

After the attribution, the best with one knob put back to its baseline value is
recommended instead when that was measured within the noise of the best, fine on every
run, inside the budget and the precision guard (the confirmation's "fewest changes among
near-equals" rule, applied to what the attribution measured).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tuner.analysis.guard import divergence
from tuner.config.space import KNOBS, Config, conflict, numerics
from tuner.tuning import study as study_mod

if TYPE_CHECKING:
    from tuner.analysis.attribution import Attribution
    from tuner.config.recipe import Recipe
    from tuner.trial.result import TrialResult
    from tuner.tuning.pool import Pool
    from tuner.tuning.searchspace import Space


def simpler(best: dict[str, Any], attribution: "Attribution", pool: "Pool", baseline: dict[str, Any],
            make: Callable[[dict[str, Any]], Config], recipe: "Recipe",
            reference: list[float] | None, space: "Space") -> tuple[dict[str, Any], str] | None:
    """``(params, note)`` of the best without the knob that bought least, when it may go and
    what is left is a point of the space (the baseline's value of a knob the space fixes
    otherwise is not: seen, persistent_workers false, the baseline's without workers, with
    8 workers where the recipe's space says ``persistent_workers: [true]``)."""
    candidates = []
    for row in attribution.rows:
        knobs = {**{k: v for k, v in best.items() if k in KNOBS}, **{k: baseline[k] for k in row.knob.split("+")}}
        if conflict(knobs) is not None:
            continue
        params = make(knobs).params()
        if not space.holds(params, recipe.world_size):
            continue
        entry, metrics = pool.entry(params), pool.metrics(params)
        if (metrics is None or entry.failures or pool.apart(best, params)
                or study_mod.over_budget(metrics, recipe) is not None
                or imprecise(params, entry.runs, reference, recipe)):
            continue
        candidates.append((pool.median(params) or 0.0, row.knob, params, row.before))
    if not candidates:
        return None
    rate, knob, params, before = max(candidates, key=lambda c: c[0])
    gap = 1 - rate / (pool.median(best) or rate)
    return params, (f"recommending the best without {knob} (kept at {before}): its gain, "
                    f"{gap:.1%}, is within the noise (±{pool.noise():.0%} a run)")


def imprecise(params: dict[str, Any], runs: "list[TrialResult]", reference: list[float] | None,
              recipe: "Recipe") -> bool:
    """Whether any run of ``params`` left the fp32 reference curve beyond the tolerance."""
    label = numerics(params)
    if label is None or not reference:
        return False
    return any(r.ok and divergence(r.losses, reference, recipe.precision.tolerance, label) for r in runs)
