"""The search's distributed controller: rank 0 decides, every rank measures.

Rank 0 owns the Optuna study (:class:`~tuner.tuning.decider.Decider`); every decision
(the next trial's knobs, or stop) is broadcast, every rank runs the trial, results are
reduced to rank 0. The finalists are then decided by the one rule in interleaved rounds
(:mod:`tuner.tuning.finish`), and the speedup is the ratio of medians of every run. The
search returns its result; writing the run folder is the caller's (:func:`tuner.api.search`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tuner.harness import distributed, interrupt
from tuner.harness.system import energy
from tuner.inputs import levers
from tuner.inputs.engine import wrapping
from tuner.inputs.errors import RecipeError
from tuner.inputs.levers import LEVERS
from tuner.inputs.plan import Plan
from tuner.inputs.space import Machine
from tuner.runner import Runner, runner_for
from tuner.study import searchspace
from tuner.trial.failures import ProcessPoisoned
from tuner.tuning import budget, finish, path
from tuner.tuning.decider import Decider
from tuner.tuning.events import Said, SearchEvents
from tuner.tuning.pool import Pool

ATTRIBUTE_REPEATS = 1
"""Runs of each attribution path configuration the search and the finish have not measured
(``--attribute``), inside what is left of the finish's budget: the path describes, the
finish's questions decide, so its rounds go to those first."""

if TYPE_CHECKING:
    from tuner.analysis.attribution import Attribution
    from tuner.harness.distributed import DistContext
    from tuner.inputs.recipe import Recipe
    from tuner.trial.trial_result import PruneRule, TrialResult
    from tuner.tuning.search_result import SearchResult


def run_search(recipe: "Recipe", ctx: "DistContext", confirm: int, attribute: int | None,
               events: SearchEvents | None, finish_minutes: float | None = None,
               on_result: "Callable[[SearchResult], None] | None" = None,
               began: float | None = None) -> "SearchResult | None":
    """Search ``recipe`` on every rank; rank 0 returns the result, after ``on_result`` (the
    caller writing it out) has run with Ctrl-C deferred: what was measured is never lost.
    ``began``: when the command began (``time.monotonic``), which ``budget.minutes`` counts from."""
    machine = Machine.detect()
    space = searchspace.build_space(recipe, machine)
    if recipe.objective == "samples_per_joule":
        _check_energy(machine)
    runner = runner_for(recipe, ctx)
    scanned = runner.largest_batch()  # a sample_size that fails stops the search here
    runner.prepare(_prepared_kinds(space, recipe, machine))  # one-time costs before the first trial
    pool = Pool(recipe.objective)
    decider = Decider(recipe, space, machine, events or SearchEvents(), pool, runner, began) if ctx.is_main else None
    if decider is not None and scanned:
        decider.events.detail(scanned)
    runner.on_hang = decider.record_hung if decider else None
    if decider is not None:  # what the search leaves of budget.minutes for its finish
        decider.finish_after = (0.0, 0.0) if confirm < 1 else (
            (0.0, finish_minutes * 60) if finish_minutes is not None else (finish.TIME_SHARE, 0.0))
    try:
        return _search(recipe, ctx, confirm, attribute, finish_minutes, machine, space, pool, decider, runner,
                       on_result)
    finally:  # the heartbeat thread and the finishing lock, also when storage or a trial failed
        runner.close()
        if decider is not None:
            decider.workers.close()
            decider.study.release()


def _search(recipe: "Recipe", ctx: "DistContext", confirm: int, attribute: int | None,
            finish_minutes: float | None, machine: Machine, space: "searchspace.Space", pool: Pool,
            decider: Decider | None, runner: Runner,
            on_result: "Callable[[SearchResult], None] | None") -> "SearchResult | None":
    stopped = "interrupted"
    finished: finish.Finished | None = None
    attribution: Attribution | None = None

    def run(config: Plan, prune: "PruneRule | None" = None) -> "TrialResult":
        """A repeat's, the finish's or the attribution's run; the search's own trials go through
        :func:`_poisoned` once recorded."""
        return _poisoned(runner.run(config, prune))

    leading = False
    """This worker finishes the search (:meth:`~tuner.study.workers.Workers.lead`)."""
    try:
        while True:
            order = distributed.broadcast(decider.next(interrupt.pressed()) if decider else None)
            if order["stop"] and order["stop"] != "interrupted" and not leading:
                other = distributed.broadcast(decider.workers.lead() if decider else None)
                if other is not None:  # another worker shares this study and finishes it
                    if decider:
                        decider.events.note(Said("worker_done", {"worker": decider.workers.id, "other": other}))
                        decider.events.stop()
                    return None
                leading = True
                continue  # the others' trials are in: a dead worker's, put back, may still be to run
            if order["stop"]:
                stopped = order["stop"]
                break
            if order.get("repeat"):  # the baseline or the best again: the noise the prune and the stop read
                pool.add(run(order["repeat"]), "repeat")
                continue
            config = order["config"]
            # Every rank must take part in the pruning decision, which rank 0 makes.
            prune = ((decider.prune if decider else budget.never) if order["prune"] else None)
            if order.get("reference") and runner.curves:  # the guard needs an fp32 curve first
                reference = run(order["reference"])
                pool.add(reference, "search")
                if decider:
                    decider.set_reference(reference)
            result = runner.run(config, prune)
            pool.add(result, "search", trial=decider.trial.number if decider and decider.trial else None)
            if decider:
                decider.record(result)
            _poisoned(result)  # recorded first: the same command resumes without it
        if stopped not in ("interrupted", "broken"):  # nothing to confirm in a job that fails anyway
            finished, attribution = _finalise(recipe, machine, space, decider, confirm, attribute, finish_minutes,
                                               run, pool)
    except KeyboardInterrupt:
        if decider is None:
            raise
        decider.interrupted()
        stopped, finished, attribution = "interrupted", None, None
    if decider is None:
        return None
    if interrupt.pressed():  # a Ctrl-C Python dropped on the way (see tuner.harness.interrupt)
        stopped, finished, attribution = "interrupted", None, None
    with interrupt.deferred():
        result = decider.finish(stopped, finished, attribution)
        if on_result is not None:
            on_result(result)  # the workers close after the run folder: the next search may finish again
        if stopped != "interrupted":
            decider.workers.mark_finished()
    return result


def _finalise(recipe: "Recipe", machine: Machine, space: "searchspace.Space", decider: Decider | None, confirm: int,
              attribute: int | None, finish_minutes: float | None, run: Callable[[Plan], "TrialResult"],
              pool: Pool) -> tuple["finish.Finished | None", "Attribution | None"]:
    """The finish (:func:`tuner.tuning.finish.finish`), then the attribution path's
    configurations the pool lacks, on every rank; rank 0 says what to measure. One
    :class:`~tuner.tuning.finish.Budget` bounds both: ``confirm`` rounds a question, and its
    seconds (``finish_minutes``, else a share of the search's own time, inside ``budget.minutes``)."""
    events, make, valid = decider.events if decider else None, space.make.normalised, space.valid

    plan = distributed.broadcast({"finalists": decider.finalists(), "baseline": decider.baseline_params,
                                  "seconds": decider.finish_seconds(finish_minutes),
                                  "typical": decider.typical_trial_s()} if decider else None)
    if not plan["finalists"]:
        return None, None
    budget = finish.Budget(plan["seconds"], max(1, confirm), plan["typical"])
    repeats = ATTRIBUTE_REPEATS if attribute is None else attribute
    lead = decider.attribution_plan(plan["finalists"][0]) if decider is not None and repeats > 0 else None
    if confirm > 0 and lead:  # rank 0's clock decides every run
        path.hold_for(budget, repeats, pool, lead["baseline"], lead["best"], make, valid)

    def measure(params: dict[str, Any]) -> "TrialResult":
        return run(Plan.recorded(recipe.world_size, params))

    finished = None
    if confirm > 0:
        rules = finish.Rules(recipe.tolerance, make, decider.answerable if decider else (lambda p: True), valid,
                             levers.proven, decider.ruled_out if decider else (lambda p: None))
        finished = finish.finish(plan["finalists"], plan["baseline"], measure, pool, rules, budget,
                                 distributed.broadcast, events)
    answer = finished.answer if finished is not None else plan["finalists"][0]
    ends = distributed.broadcast(decider.attribution_plan(answer) if decider and repeats > 0 else None)
    if not ends:
        return finished, None
    points = path.configs(ends["baseline"], ends["best"], make, valid)
    todo = len(path.lacking(list(points.values()), pool))
    if todo and events is not None:
        events.detail(Said("attributing", {"configurations": len(points), "todo": todo, "repeats": repeats}))
    path.describe(list(points.values()), repeats, measure, pool, budget, distributed.broadcast)
    return finished, path.table(ends["baseline"], ends["best"], pool, make, recipe.tolerance, valid)


def _check_energy(machine: Machine) -> None:
    """``objective: samples_per_joule`` needs an energy counter on this node (its GPUs', or
    its host's packages on a CPU node)."""
    why = energy.node_why(machine.cuda)
    if why is not None:
        raise RecipeError(f"objective: samples_per_joule needs an energy counter, and this node has none: "
                          f"{why}; search for throughput (objective: samples_per_s) or run where NVML "
                          "or the powercap counters can be read")


def _poisoned(result: "TrialResult") -> "TrialResult":
    """The result, unless its trial left this process unable to run another: then every
    rank stops here (the trial is recorded; the command line exits for a re-run)."""
    if result.restart:
        raise ProcessPoisoned(result.restart, result.state, result.reason)
    return result


def _prepared_kinds(space: "searchspace.Space", recipe: "Recipe", machine: Machine) -> list[Plan]:
    """One configuration per one-time setup the space can need: DeepSpeed, compile."""
    c = space.choices
    knobs: list[dict[str, Any]] = []
    if any(z > 0 for z in c["zero_stage"]) or wrapping(recipe.engine):
        other, off = LEVERS["zero_stage"].alternative or ("zero_stage", 0)  # the other sharding lever off
        knobs.append({other: off, "zero_stage": max(c["zero_stage"]), "offload_optimizer": "none"})
    if True in c["compile"]:
        knobs.append({"compile": True})
    base = searchspace.baseline_knobs(recipe, space, machine)
    return [space.make({**base, **k}) for k in knobs]
