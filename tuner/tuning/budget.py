"""When a search stops, and when a trial is cut short.

The stops are the recipe's: the target met, the trial budget spent, or the next trial
expected to overrun the minutes. The prune rule is a pure function of a trial's window
(:data:`tuner.trial.trial_result.PruneRule`): the measured loop asks it and touches nothing else.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Mapping

from tuner.harness.metrics import Window
from tuner.stats.prune import PruneBar, typical_window
from tuner.stats.window_length import AUTO
from tuner.study import records as study_mod
from tuner.trial.ceiling_comm_flops import CEILING_FROM_WINDOW_BELOW, STALL_FREE_STEPS
from tuner.trial.trial_result import State

if TYPE_CHECKING:
    from tuner.inputs.recipe import Budget, Steps, Target
    from tuner.study.study import Study
    from tuner.study.trial_record import Record
    from tuner.tuning.pool import Pool


CONVERGED_AFTER = (2, 5)
"""Sampler trials, after the guided neighbourhood is exhausted, each shown by the one rule
(:mod:`tuner.stats.decision`) to be no gain beyond the tolerance over the best, before
the search has converged: a fifth of the space not yet measured, at least 2, at most 5
(a small space does not spend its budget on a sampler that finds nothing).
"""


def converged_after(space_size: int, measured: int) -> int:
    """The streak of sampler trials without progress that ends the search (``stopped:
    converged``) with ``measured`` of ``space_size`` configurations known."""
    low, high = CONVERGED_AFTER
    return max(low, min(high, math.ceil(max(0, space_size - measured) / 5)))


def meets(metrics: Mapping[str, Any] | None, target: "Target") -> bool:
    """Whether measured ``metrics`` reach the recipe's target (samples/s or tokens/s)."""
    if not metrics:
        return False
    if target.samples_per_s is not None and metrics["samples_per_s"] >= target.samples_per_s:
        return True
    tps = metrics.get("tokens_per_s")
    return target.tokens_per_s is not None and tps is not None and tps >= target.tokens_per_s


def stop_reason(study: "Study", budget: "Budget", target: "Target", elapsed_s: float,
                running: int = 0, finish: tuple[float, float] = (0.0, 0.0),
                searched_s: float | None = None) -> str | None:
    """``target``, ``trials`` or ``minutes`` when the search must stop before another trial;
    ``running``: other workers' trials in flight, which count against the trial budget;
    ``finish``: (share of the search's time, fixed seconds) the finish takes after it, kept
    inside ``budget.minutes`` (the minutes bound the whole command, ``elapsed_s`` so far; the
    share is of ``searched_s``, the trials' part of it, by default all of it)."""
    best = study_mod.best_feasible(study)
    if best is not None and meets(best.metrics, target):
        return "target"
    done = ran(study)
    if len(done) + running >= budget.trials:
        return "trials"
    if budget.minutes is not None:
        durations = [t.duration_s for t in done if t.duration_s]
        expected = statistics.median(durations) if durations else 0.0
        share, fixed = finish
        searched = elapsed_s if searched_s is None else searched_s
        if elapsed_s + expected + share * (searched + expected) > budget.minutes * 60 - fixed:
            return "minutes"
    return None


def ran(study: "Study") -> list["Record"]:
    """The trials that count against the trial budget: measured, not skipped."""
    return [t for t in study_mod.measured(study) if t.outcome != State.SKIPPED]


def prune_rule(best: "Record", world_size: int, tolerance: float, pool: "Pool", steps: "Steps") -> PruneBar:
    """Cut a trial whose settled steps show it slower than ``best`` by more than the
    ``tolerance`` (:mod:`tuner.stats.prune`), on the noise this run has measured (its pooled
    repeats, with their degrees of freedom: none measured, no cut); data, so a script trial
    applies it too."""
    ss, dof = pool.spread()
    runs = pool.entry(best.params or {}).rates
    windows = [m["measured_steps"] + (m.get("warmup_set_aside") or 0) for e in pool.entries.values() for r in e.runs
               if r.ok and (m := r.metrics) and m.get("measured_steps")]
    within = typical_window(windows, steps.measure if isinstance(steps.measure, int) else None, AUTO.min_steps)
    return PruneBar(best.value or 0.0, world_size, tolerance, math.sqrt(ss / dof) if dof else None, dof,
                    max(1, len(runs)), within)


def never(window: Window) -> bool:
    """Other ranks' stand-in for rank 0's pruning rule (rank 0 decides, all follow)."""
    return False


def pruning_saved_s(window: "Steps", global_batch_size: int, pool: "Pool", steps: int, rate: float) -> float:
    """The seconds a trial pruned after ``steps`` measured steps (at ``rate`` samples/s) did
    not spend, given the recipe's ``steps`` (``window``): the rest of a typical window and
    the stall-free steps after it (where the typical window waited for data enough to
    measure them, :mod:`tuner.trial.ceiling_comm_flops`)."""
    runs = [r.metrics for e in pool.entries.values() for r in e.runs if r.ok and r.metrics]
    windows = [m["measured_steps"] for m in runs if m.get("measured_steps")]
    waits = [m["data_wait_share"] for m in runs if m.get("data_wait_share") is not None]
    ceiling = not waits or statistics.median(waits) >= CEILING_FROM_WINDOW_BELOW
    typical = window.measure if isinstance(window.measure, int) else (
        statistics.median(windows) if windows else steps)
    step_s = global_batch_size / rate
    window_s = max(0.0, typical - steps) * step_s
    if not isinstance(window.measure, int):
        window_s = min(window_s, AUTO.max_s)  # an auto window ends at its time cap
    return window_s + (min(window.most, STALL_FREE_STEPS) * step_s if ceiling else 0.0)
