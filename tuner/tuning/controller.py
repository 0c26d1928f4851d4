"""The search's distributed controller: rank 0 decides, every rank measures.

Rank 0 owns the Optuna study (:class:`~tuner.tuning.decider.Decider`); every decision
(the next trial's knobs, or stop) is broadcast, every rank runs the trial, results are
reduced to rank 0. The winner is then re-measured against the baseline, interleaved, and
the speedup is the ratio of medians (:mod:`tuner.tuning.finalists`). The search returns
its result; writing the run folder is the caller's (:func:`tuner.api.search`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tuner.analysis.attribution import leave_one_out
from tuner.config.space import KNOBS, Config, Machine, make_config, reference_knobs
from tuner.harness import distributed, interrupt
from tuner.runner import Runner, runner_for
from tuner.study import searchspace
from tuner.trial.failures import ProcessPoisoned
from tuner.tuning import budget, finalists, recommend
from tuner.tuning.decider import Decider
from tuner.tuning.events import SearchEvents
from tuner.tuning.pool import Pool

ATTRIBUTE_REPEATS = 3
"""Runs of each attribution configuration not already measured (``--attribute``; at most
``--confirm``): the table's medians. What each change is worth to the answer is then
settled by the one rule, interleaved, as long as it takes."""

if TYPE_CHECKING:
    from tuner.analysis.attribution import Attribution
    from tuner.config.recipe import Recipe
    from tuner.harness.distributed import DistContext
    from tuner.trial.trial_result import PruneRule, TrialResult
    from tuner.tuning.search_result import SearchResult


def run_search(recipe: "Recipe", ctx: "DistContext", confirm: int, attribute: int | None,
               events: SearchEvents | None,
               on_result: "Callable[[SearchResult], None] | None" = None) -> "SearchResult | None":
    """Search ``recipe`` on every rank; rank 0 returns the result, after ``on_result`` (the
    caller writing it out) has run with Ctrl-C deferred: what was measured is never lost."""
    machine = Machine.detect()
    space = searchspace.build_space(recipe, machine)
    runner = runner_for(recipe, ctx)
    runner.prepare(_prepared_kinds(space, recipe, machine))  # one-time costs before the first trial
    pool = Pool()
    decider = Decider(recipe, space, machine, events or SearchEvents(), pool, runner) if ctx.is_main else None
    runner.on_hang = decider.record_hung if decider else None
    try:
        return _search(recipe, ctx, confirm, attribute, machine, space, pool, decider, runner, on_result)
    finally:  # the heartbeat thread and the finishing lock, also when storage or a trial failed
        runner.close()
        if decider is not None:
            decider.workers.close()


def _search(recipe: "Recipe", ctx: "DistContext", confirm: int, attribute: int | None, machine: Machine,
            space: "searchspace.Space", pool: Pool, decider: Decider | None, runner: Runner,
            on_result: "Callable[[SearchResult], None] | None") -> "SearchResult | None":
    stopped = "interrupted"
    confirmed: finalists.Confirmation | None = None
    attribution: Attribution | None = None

    def run(config: Config, prune: "PruneRule | None" = None) -> "TrialResult":
        """A confirmation's or an attribution's run; the search's own trials go through
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
                        decider.events.note(f"worker done ({decider.workers.id}): {other} confirms the finalists "
                                            "and writes the run folder")
                        decider.events.stop()
                    return None
                leading = True
                continue  # the others' trials are in: a dead worker's, put back, may still be to run
            if order["stop"]:
                stopped = order["stop"]
                break
            if order.get("repeat"):  # the baseline or the best again: the noise the prune and the stop read
                pool.add(run(Config(**order["repeat"])), "repeat")
                continue
            config, _ = make_config(order["knobs"], recipe.global_batch_size, recipe.world_size, machine, recipe.engine)
            # Every rank must take part in the pruning decision, which rank 0 makes.
            prune = ((decider.prune if decider else budget.never) if order["prune"] else None)
            if order.get("reference") and runner.curves:  # the guard needs an fp32 curve first
                reference = run(make_config(reference_knobs(config.params()), recipe.global_batch_size,
                                            recipe.world_size, machine, recipe.engine)[0])
                pool.add(reference, "search")
                if decider:
                    decider.set_reference(reference)
            result = runner.run(config, prune)
            pool.add(result, "search")
            if decider:
                decider.record(result)
            _poisoned(result)  # recorded first: the same command resumes without it
        if stopped not in ("interrupted", "broken"):  # nothing to confirm in a job that fails anyway
            confirmed, attribution = _finalise(recipe, machine, space, decider, confirm, attribute, run, pool)
    except KeyboardInterrupt:
        if decider is None:
            raise
        decider.interrupted()
        stopped, confirmed, attribution = "interrupted", None, None
    if decider is None:
        return None
    if interrupt.pressed():  # a Ctrl-C Python dropped on the way (see tuner.harness.interrupt)
        stopped, confirmed, attribution = "interrupted", None, None
    with interrupt.deferred():
        result = decider.finish(stopped, confirmed, attribution)
        if on_result is not None:
            on_result(result)  # the workers close after the run folder: the next search may finish again
        if stopped != "interrupted":
            decider.workers.mark_finished()
    return result


def _finalise(recipe: "Recipe", machine: Machine, space: "searchspace.Space", decider: Decider | None, confirm: int,
              attribute: int | None, run: finalists.Run,
              pool: Pool) -> tuple["finalists.Confirmation | None", "Attribution | None"]:
    """Confirmation, attribution, then the changes of the answer settled, on every rank;
    rank 0 says what to measure. One :class:`~tuner.tuning.finalists.Limit` bounds it all:
    ``confirm`` rounds per decision, and a share of the search's own time."""
    events = decider.events if decider else None
    limit = finalists.Limit(confirm, distributed.broadcast(decider.finish_seconds() if decider else None))
    order = distributed.broadcast(
        {"finalists": decider.finalists(), "baseline": decider.baseline_config.params()} if decider else None)
    confirmed = finalists.confirm(order["finalists"], order["baseline"], limit, run, pool,
                                  distributed.broadcast, events, recipe.tolerance)
    if confirmed is not None and events is not None:
        for note in confirmed.notes:
            events.note(note)
    repeats = min(confirm, ATTRIBUTE_REPEATS) if attribute is None else attribute
    plan = distributed.broadcast(decider.attribution_plan(confirmed) if decider and repeats > 0 else None)
    if not plan:
        return confirmed, None

    def make(knobs: dict[str, Any]) -> Config:
        return make_config(knobs, recipe.global_batch_size, recipe.world_size, machine, recipe.engine,
                           strict=False)[0]

    def valid(knobs: Any) -> bool:
        """A layout the world and the global batch allow (a change toward the best may need
        its layout first: a micro-batch a larger data-parallel share cannot hold)."""
        return space.refusal(make({k: v for k, v in knobs.items() if k in KNOBS}).params(), recipe.world_size,
                             recipe.global_batch_size) is None

    attribution = finalists.attribute(plan["baseline"], plan["best"], repeats, run, pool, make, events,
                                      recipe.tolerance, valid)
    if attribution is not None and confirm > 0:
        fastest = recommend.fastest_of(plan["best"], confirmed)
        simpler = [make({k: v for k, v in c.items() if k in KNOBS}) for _, c in leave_one_out(plan["baseline"],
                                                                                              plan["best"], valid)]
        finalists.settle_changes(fastest, simpler, limit, run, pool, distributed.broadcast, events, recipe.tolerance)
        attribution = finalists.table(plan["baseline"], plan["best"], pool, make, recipe.tolerance, valid)
        # several changes shown cheap alone: the answer without all of them, against the fastest
        combined = distributed.broadcast(decider.without_all(plan["best"], fastest, attribution) if decider else None)
        if combined is not None:
            if events is not None:
                events.note("several changes each cost less than the tolerance: measuring the answer without all "
                            "of them against the fastest, interleaved")
            finalists.settle([(fastest, combined)], lambda p: pool.add(run(make(dict(p))), "confirmation"), pool,
                             recipe.tolerance, limit, distributed.broadcast)
    return confirmed, attribution


def _poisoned(result: "TrialResult") -> "TrialResult":
    """The result, unless its trial left this process unable to run another: then every
    rank stops here (the trial is recorded; the command line exits for a re-run)."""
    if result.restart:
        raise ProcessPoisoned(result.restart, result.state, result.reason)
    return result


def _prepared_kinds(space: "searchspace.Space", recipe: "Recipe", machine: Machine) -> list[Config]:
    """One configuration per one-time setup the space can need: DeepSpeed, compile."""
    c = space.choices
    knobs: list[dict[str, Any]] = []
    if any(z > 0 for z in c["zero_stage"]) or recipe.engine == "deepspeed":
        other, off = KNOBS["zero_stage"].alternative or ("zero_stage", 0)  # the other sharding lever off
        knobs.append({other: off, "zero_stage": max(c["zero_stage"]), "offload_optimizer": "none"})
    if True in c["compile"]:
        knobs.append({"compile": True})
    base = searchspace.baseline_knobs(recipe, space, machine)
    return [make_config({**base, **k}, recipe.global_batch_size, recipe.world_size, machine, recipe.engine)[0]
            for k in knobs]
