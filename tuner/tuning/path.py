"""The attribution's configurations (the path from the baseline to the answer, one knob at a
time, and every leave-one-out) and their table from the pool: one median per configuration,
each step's interval paired where the two were measured in the same rounds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from tuner.analysis import attribution as attribution_mod
from tuner.analysis.attribution import Attribution
from tuner.tuning.finish_budget import hold
from tuner.tuning.pool import key

if TYPE_CHECKING:
    from tuner.tuning.finish import Agree, Run
    from tuner.tuning.finish_budget import Budget
    from tuner.tuning.pool import Pool

Make = Callable[[dict[str, Any]], dict[str, Any]]
"""A configuration's full params from its knobs."""


def configs(base: dict[str, Any], best: dict[str, Any], make: Make,
            valid: "attribution_mod.Valid | None" = None) -> dict[str, dict[str, Any]]:
    """Every configuration on the baseline-to-best path and every leave-one-out, by the
    attribution's key."""
    points = [c for _, c in [*attribution_mod.path(base, best, valid),
                             *attribution_mod.leave_one_out(base, best, valid)]]
    return {attribution_mod.key(c): make({n: c[n] for n in attribution_mod.ORDER if n in c}) for c in points}


def table(base: dict[str, Any], best: dict[str, Any], pool: "Pool", make: Make, tolerance: float,
          valid: "attribution_mod.Valid | None" = None) -> Attribution:
    """The attribution table from what the pool holds."""
    points = configs(base, best, make, valid)
    failures = {k: why for k, c in points.items()
                if (why := next(({"state": str(r.state), "reason": r.reason, "ruled": r.ruled}
                                 for r in pool.entry(c).runs if not r.ok), None))}
    batch_norm = any(r.batch_norm for e in pool.entries.values() for r in e.runs)
    rates = {k: pool.rates(c) for k, c in points.items()}

    def interval(a: Any, b: Any) -> Any:
        return pool.slowdown(points[attribution_mod.key(a)], points[attribution_mod.key(b)])

    return attribution_mod.attribute(base, best, rates, failures, batch_norm, tolerance, pool.spread(), valid,
                                     interval)


def lacking(configs: Sequence[dict[str, Any]], pool: "Pool") -> list[dict[str, Any]]:
    """The configurations the pool has no run of (what :func:`describe` measures)."""
    return [dict(c) for c in configs if not pool.entry(c).runs]


def hold_for(budget: "Budget", runs: int, pool: "Pool", base: dict[str, Any], lead: dict[str, Any], make: Make,
             valid: "attribution_mod.Valid | None" = None) -> None:
    """Hold back from the finish's rounds what :func:`describe` will need for the path to the
    leading finalist: ``runs`` each of the configurations the pool lacks at each run's start
    (what the rounds measure on the way counts). The search and its simulation
    (``scripts/finish_world.py``) both set the finish's budget so."""
    points = list(configs(base, lead, make, valid).values())
    budget.held = lambda: hold(budget, runs * len(lacking(points, pool)))


def describe(configs: Sequence[dict[str, Any]], runs: int, run: "Run", pool: "Pool", budget: "Budget",
             agree: "Agree" = lambda x: x) -> int:
    """The attribution path's configurations the pool has no run of, ``runs`` times each,
    interleaved, inside what is left of the budget (they describe; they decide nothing).
    Returns the runs measured."""
    budget.held = None  # what the rounds held back is this
    todo = lacking(configs, pool)
    done = 0
    for r in range(runs):
        for c in todo:
            if pool.entry(c).failures:
                continue
            if not agree(budget.fits(key(c))):
                return done
            began = budget.clock()
            pool.add(run(dict(c)), "attribution", ("path", r))
            budget.durations.setdefault(key(c), []).append(budget.clock() - began)
            done += 1
    return done
