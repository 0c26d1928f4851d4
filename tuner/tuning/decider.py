"""Rank 0's side of a search: the study, the budget, what to measure next.

The loop is the method: what to measure comes from the chain of proposers (the baseline,
``tuner plan``'s seed, one change at a time from the best so far, then the sampler:
:mod:`tuner.tuning.proposing.proposers`); what may not run is recorded ``skipped`` by the filters
(:mod:`tuner.tuning.proposing.filters`); a configuration proposed again is answered from what was
already measured, never measured twice; slow trials are pruned (:mod:`tuner.tuning.budget`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tuner.analysis.diagnose import Verdict
from tuner.analysis.remedies import Here
from tuner.harness.metrics import budget_peak, objective_value
from tuner.harness.system.environment import environment
from tuner.inputs.plan import Plan
from tuner.inputs.space import Machine, reference_knobs
from tuner.memory import model as memory
from tuner.study import records as study_mod
from tuner.study import searchspace
from tuner.study.trial_record import Record, Status
from tuner.study.workers import Workers, fingerprint
from tuner.trial.trial_result import State, TrialResult
from tuner.tuning import budget, config_view, recommend, result_builder
from tuner.tuning.convergence import Convergence
from tuner.tuning.events import Said, SearchEvents
from tuner.tuning.failing_job import why_broken
from tuner.tuning.finish import FINALISTS, TIME_SHARE
from tuner.tuning.pool import Pool
from tuner.tuning.proposing import filters, proposers
from tuner.tuning.search_result import SearchResult

if TYPE_CHECKING:
    from tuner.analysis.attribution import Attribution
    from tuner.inputs.recipe import Recipe
    from tuner.runner import Runner
    from tuner.study.study import Asked
    from tuner.trial.trial_result import PruneRule
    from tuner.tuning.finish import Finished

MAX_RESAMPLES = 50
"""Times the sampler may propose a measured configuration before the space counts as exhausted."""


class Decider:
    """Decides each next trial on rank 0 and records what every trial gave."""

    def __init__(self, recipe: "Recipe", space: searchspace.Space, machine: Machine, events: SearchEvents,
                 pool: Pool | None = None, runner: "Runner | None" = None, started: float | None = None) -> None:
        self.recipe, self.space, self.machine, self.events, self.runner = recipe, space, machine, events, runner
        self.pool = pool if pool is not None else Pool(recipe.objective)
        self.convergence = Convergence(self.pool, recipe.tolerance)
        self._environment: dict[str, Any] | None = None
        self.pruned, self.saved_s = 0, 0.0
        self.broken: dict[str, Any] | None = None
        """Why the search stopped as ``broken`` (:func:`tuner.tuning.failing_job.why_broken`)."""
        """Trials pruned in this run, and the measuring seconds that saved (estimated)."""
        for note in space.notes:
            events.note(note)
        self.study, stale = study_mod.open_study(recipe.name, recipe.storage, recipe.seed)
        if stale:
            events.note(Said("stale", {"trials": stale}))
        self.workers = Workers(self.study, events.note, lambda: recipe.budget.trials - len(budget.ran(self.study)))
        self.baseline = searchspace.baseline_knobs(recipe, space, machine)
        self.points = searchspace.every_key(space)
        self.configs = space.make
        self.config_of = self.configs.of_params  # a trial's full params too: the accumulation and engine derived again
        self.baseline_config = self.config_of(self.baseline)
        self.baseline_params = self.baseline_config.params()
        """The baseline as the study records it (the pool, the finish and best.json key on it)."""
        self.searching = time.monotonic()
        """When the search's trials began: the finish's share (:data:`TIME_SHARE`) is of their time."""
        self.started = started if started is not None else self.searching
        """When the command began (``time.monotonic``): ``budget.minutes`` bounds it whole, the look
        at a script's own settings and the one-time preparations included."""
        self.earlier_s = sum(t.duration_s for t in study_mod.measured(self.study) if t.duration_s)
        self.finish_after: tuple[float, float] = (TIME_SHARE, 0.0)
        """(share of the search's time, fixed seconds) the finish will take: what the search
        leaves of ``budget.minutes`` (the controller sets it from ``--confirm`` / ``--finish-minutes``)."""
        self.baseline_again = False
        """The baseline has been measured a second time (:meth:`_baseline_again`)."""
        self.trial: Asked | None = None
        self.current: Plan | None = None
        self.prune: PruneRule | None = None
        """The pruning rule for the trial in flight (``None``: no best to compare with yet)."""
        self.known = self._known()
        self.guard = filters.PrecisionGuard(recipe.precision.tolerance,
                                            filters.first_losses(study_mod.feasible(self.study)))
        """The precision guard, its reference from a resumed study if it has one."""
        self.notes_seen: set[str] = set()
        self.unmeasured: dict[str, str] = {}  # why a metric is null, as the first trial without it said
        self.memory, why = memory.model_for(recipe.task, recipe.task_args, recipe.world_size, not machine.cuda,
                                           study_mod.measured(self.study))
        """Predicts each trial's peak before it runs (:mod:`tuner.memory.model`)."""
        if why:
            events.detail(why)
        self.proposers: list[proposers.Proposer] = [
            proposers.Baseline(self.baseline, _claim(self.baseline_config), self.workers),
            self._seed() if not self.known else proposers.PlanSeed(None),
            proposers.GuidedWalk(space, self.verdicts, lambda k: searchspace.config_key(self.config_of(k)))]
        """The chain that proposes each next trial, before the sampler (:mod:`tuner.tuning.proposing.proposers`)."""
        events.start(self.done(), len(self.known))

    @property
    def reference(self) -> list[float] | None:
        """The precision guard's reference loss curve (fp32, eager)."""
        return self.guard.reference

    def _seed(self) -> proposers.PlanSeed:
        """Right after the baseline of a new study, the largest micro-batch ``tuner plan``'s
        profile predicts to fit the budget (the baseline's other knobs), unless prediction is off."""
        if self.memory is None:
            return proposers.PlanSeed(None)
        fed, note = memory.feed_plan(self.memory, self.recipe.out, self.recipe.path)
        if note:
            self.events.detail(note)
        limit = self.recipe.budget.memory_gib
        if not fed or limit is None or not self.recipe.budget.skip:
            return proposers.PlanSeed(None)
        micro, gib = memory.largest_fitting(self.memory, [self.config_of({**self.baseline, "micro_batch_size": m})
                                                          for m in self.space.choices["micro_batch_size"]], limit)
        if micro is None or micro == self.baseline_config.micro_batch_size:
            return proposers.PlanSeed(None)
        return proposers.PlanSeed({**self.baseline, "micro_batch_size": micro},
                                  Said("plan_seed", {"micro_batch_size": micro, "gib": gib, "limit": limit}))

    # --- decisions ------------------------------------------------------------------------

    def next(self, interrupted: bool) -> dict[str, Any]:
        """The next order, made on rank 0 and broadcast: a trial's ``config`` (with the guard's
        ``reference`` to run first), a ``repeat``, or why to ``stop``. Configurations the memory
        model predicts over the budget are recorded ``skipped`` on the way."""
        for _ in range(MAX_RESAMPLES):
            order = self._next(interrupted)
            if not order.get("skipped"):
                return order
        return {"stop": "exhausted"}

    def _next(self, interrupted: bool) -> dict[str, Any]:
        self.workers.reap()
        self.known, flying = self._known(), self.workers.elsewhere()
        stop = "interrupted" if interrupted else budget.stop_reason(
            self.study, self.recipe.budget, self.recipe.target, self._elapsed_s(), len(flying), self.finish_after,
            self._searched_s())
        if stop is None and self.points is not None and self.points <= set(self.known) and not flying:
            stop = "exhausted"
            self._once(Said("exhausted", {"configurations": len(self.points)}))  # asked again by the other workers
        if stop is None and (broken := why_broken(study_mod.measured(self.study))):
            self.broken = broken
            self._once(Said("broken", {"why": broken}), self.events.note)  # asked again by each worker's next turn
            return {"stop": "broken"}
        if stop or self.workers.finishing_elsewhere():
            return {"stop": stop or "finishing elsewhere"}
        best = study_mod.best_feasible(self.study)
        def taken(knobs: Any) -> bool:
            config = self.config_of(knobs)
            return searchspace.config_key(config) in self.known or _claim(config) in flying

        if (again := self._baseline_again(best)) is not None:
            return {"stop": None, "repeat": again}
        step = proposers.first(self.proposers, proposers.Round(best, self.known, taken, self._outcome))
        repeat = self.convergence.repeat(best) if step is None and best is not None and \
            self.recipe.budget.converge else None
        if repeat is not None:
            if self.convergence.repeats == 1:
                self.events.detail(Said("best_again"))
            return {"stop": None, "repeat": Plan.recorded(self.recipe.world_size, repeat)}
        if step is None and self.recipe.budget.converge and \
                self.convergence.converged(self.space.size(), len(self.known)):
            self._once(Said("converged", {"streak": self.convergence.streak,  # asked again once this worker
                                          "tolerance": self.recipe.tolerance}))  # leads the finish
            return {"stop": "converged"}
        if step is not None:
            self.study.enqueue(step.knobs, step.attrs)
        self.convergence.sampled = step is None and best is not None
        for _ in range(MAX_RESAMPLES):
            trial = self.study.ask(self.workers.me)
            knobs = searchspace.suggest(trial, self.space, self.baseline, self.recipe.world_size)
            config = self.config_of(knobs)
            seen = self.known.get(searchspace.config_key(config))
            why = self.workers.claim(trial, _claim(config)) if seen is None else None
            if why in ("budget", "finishing"):  # the last of the budget taken, or a finisher: decide again
                return {"skipped": True}
            if why is not None:
                continue  # another worker measures it
            if seen is None:
                self.trial, self.current = trial, config
                self.workers.begin(trial)
                if self._predict(trial, config):
                    return {"skipped": True}
                self.prune = budget.prune_rule(best, self.recipe.world_size, self.recipe.tolerance, self.pool,
                                               self.recipe.steps) if best is not None and \
                    config != self.baseline_config and self.recipe.objective == "samples_per_s" else None
                # the baseline, run late by a worker, is what compares; the prune bar reads step rates, not joules
                self.events.chose(trial.number, proposers.chosen_by(trial.attrs))
                self.events.begin(trial.number, config)
                reference = self.config_of(reference_knobs(config.params())) if self.guard.needs_reference(config) \
                    else None
                return {"stop": None, "config": config, "prune": self.prune is not None, "reference": reference}
            self._answer_duplicate(trial, seen)
        return {"stop": "exhausted"}

    def _baseline_again(self, best: Record | None) -> Plan | None:
        """The baseline once more, right after its first run, while the run has measured no
        noise: the prune rule cuts only on a noise this run measured (:mod:`tuner.stats.prune`);
        the second run gives it one, and the finish a baseline of two runs."""
        if self.baseline_again or best is None or self.pool.spread()[1] > 0:
            return None
        entry = self.pool.entry(self.baseline_params)
        if len(entry.rates) != 1 or entry.failures:
            return None
        self.baseline_again = True
        self.events.detail(Said("baseline_again"))
        return self.baseline_config

    def _predict(self, trial: "Asked", config: Plan) -> bool:
        """Record the trial ``skipped`` (True) when a filter says so
        (:func:`tuner.tuning.proposing.filters.skip_reason`)."""
        why = filters.skip_reason(self.space, self.memory, self.recipe, config, trial)
        if why is None:
            return False
        self.events.chose(trial.number, proposers.chosen_by(trial.attrs))
        self.record(TrialResult.of(config, State.SKIPPED, ruled=why))
        return True

    def set_reference(self, result: TrialResult) -> None:
        """The fp32 loss curve the precision guard compares with (an extra trial, run only
        when the first reduced-precision trial comes before any fp32 one, batches in order)."""
        self.events.detail(self.guard.set_reference(result))

    def record(self, result: TrialResult) -> None:
        assert self.trial is not None and self.current is not None
        result = self.guard.judge(result, self.current)
        changed_micro = self.current.micro_batch_size != self.baseline_config.micro_batch_size
        for note in result.notes:
            self._once(note)
        self.unmeasured = {**result.unmeasured, **self.unmeasured}
        if result.batch_norm and changed_micro:
            self._once(Said("batch_norm", {"micro_batch_size": self.current.micro_batch_size}))
        extra: dict[str, Any] = {"env": fingerprint(self.environment())}
        if self.current == self.baseline_config:
            extra["baseline"] = True
        objective = self.recipe.objective
        if result.ok and result.metrics and objective_value(result.metrics, objective) is None:
            unmeasured = {"objective": objective, "unmeasured": result.unmeasured.get("energy_j_per_sample")}
            result = replace(result, state=State.ERROR, reason=None,
                             ruled={"code": "objective_unmeasured", "figures": unmeasured})
        best_before = study_mod.best_feasible(self.study)
        outcome, frozen = study_mod.record(self.study, self.trial, result, self.recipe.budget, extra, objective)
        if self.memory is not None and result.metrics and budget_peak(result.metrics):
            self.memory.observe(self.current, frozen.get("predicted_peak_gib"),
                                budget_peak(result.metrics), frozen.get("prediction"),
                                process_gib=result.metrics.get("gpu_mem_process_gib"))
        self.convergence.record(best_before, frozen)
        if result.pruned_at is not None:
            self._count_saving(*result.pruned_at)
        self.known[searchspace.config_key(self.current)] = frozen
        self.events.finish_trial(frozen, outcome, self._best_value())
        self.trial = self.current = None
        self.workers.end()

    def _once(self, note: "str | Said", say: "Callable[[str | Said], None] | None" = None) -> None:
        """Say ``note`` once however often it comes up: in the search log (``say``: the
        events' ``note`` where the user must act on it)."""
        seen = note if isinstance(note, str) else repr(note)
        if seen not in self.notes_seen:
            self.notes_seen.add(seen)
            (say or self.events.detail)(note)

    def record_hung(self, reason: str) -> None:
        """The trial in flight ran past its limit (:mod:`tuner.trial.watchdog`): recorded, never run again."""
        if self.trial is not None and self.current is not None:
            self.record(TrialResult.of(self.current, State.HUNG, reason))

    def _count_saving(self, steps: int, rate: float) -> None:
        """A pruned trial skipped the rest of its window and the steps after it."""
        self.pruned += 1
        self.saved_s += budget.pruning_saved_s(
            self.recipe.steps, self.recipe.global_batch_size, self.pool, steps, rate)

    def interrupted(self) -> None:
        """The trial in flight (if any) is recorded as failed: Ctrl-C ended it."""
        if self.trial is not None:
            self.trial.set("state", State.ERROR.value)
            self.trial.set("reason", "interrupted (Ctrl-C)")
            self.study.tell(self.trial, Status.FAIL)
            self.trial = None
        self.workers.end()

    def _answer_duplicate(self, trial: "Asked", seen: Record) -> None:
        """Tell the sampler what it proposed again, without measuring it again."""
        for key in ("state", "reason", "metrics", "params"):
            if key in seen.attrs:
                trial.set(key, seen.attrs[key])
        if (constraint := seen.attrs.get("constraint")) is not None:
            trial.constrain(constraint)
        trial.set("duplicate_of", seen.number)
        status = seen.status if seen.status in (Status.COMPLETE, Status.PRUNED) else Status.FAIL
        self.study.tell(trial, status, seen.value if status == Status.COMPLETE else None)

    def _outcome(self, knobs: Any) -> str | None:
        """The state a configuration was recorded with, if it was measured."""
        seen = self.known.get(searchspace.config_key(self.config_of(knobs)))
        return seen.outcome if seen is not None else None

    def _known(self) -> dict[tuple, Record]:
        """Every configuration measured in the study (by any worker), by its key."""
        return {searchspace.params_key(t.params or {}): t for t in study_mod.measured(self.study)}

    def done(self) -> int:
        return len(study_mod.measured(self.study))

    def _elapsed_s(self) -> float:
        """The command's seconds so far (and earlier runs' trials, on a resumed study)."""
        return self.earlier_s + time.monotonic() - self.started

    def _searched_s(self) -> float:
        """The search's trials' seconds so far (and earlier runs' trials, on a resumed study)."""
        return self.earlier_s + time.monotonic() - self.searching

    def finish_seconds(self, minutes: float | None = None) -> float:
        """How long the finish may measure: ``minutes`` (``--finish-minutes``), else its share
        of the search's own time (:data:`tuner.tuning.finish.TIME_SHARE`), and never past
        ``budget.minutes`` for the whole command."""
        seconds = minutes * 60 if minutes is not None else TIME_SHARE * self._searched_s()
        if self.recipe.budget.minutes is not None:
            seconds = min(seconds, max(0.0, self.recipe.budget.minutes * 60 - self._elapsed_s()))
        return seconds

    def typical_trial_s(self) -> float | None:
        """A search trial's median duration (what a finish run is expected to take at first)."""
        durations = [t.duration_s for t in study_mod.measured(self.study) if t.duration_s]
        return statistics.median(durations) if durations else None

    def answerable(self, params: dict[str, Any]) -> bool:
        """Whether ``params`` may be the answer (:func:`tuner.tuning.recommend.answerable`)."""
        return recommend.answerable(params, self.pool, self.recipe, self.reference, self.space)

    def ruled_out(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """Why measured ``params`` cannot be the answer (:func:`tuner.tuning.recommend.ruled_out`)."""
        return recommend.ruled_out(dict(params), self.pool, self.recipe, self.reference)

    def environment(self) -> dict[str, Any]:
        if self._environment is None:
            self._environment = environment(self.recipe.world_size)
        return self._environment

    def _best_value(self) -> float | None:
        best = study_mod.best_feasible(self.study)
        return best.value if best else None

    # --- the end --------------------------------------------------------------------------

    def finalists(self) -> list[dict[str, Any]]:
        """The best distinct feasible configurations by their search trial, best first."""
        ranked = sorted(study_mod.feasible(self.study), key=lambda t: t.value or 0.0, reverse=True)
        return [t.params or {} for t in ranked[:FINALISTS]]

    def attribution_plan(self, best: dict[str, Any] | None) -> dict[str, Any] | None:
        """The two ends of the attribution: the baseline's and the answer's knobs (``None``:
        no answer, or the baseline never ran fine)."""
        if best is None or not any(t.baseline and t.outcome == State.OK
                                   for t in study_mod.measured(self.study)):
            return None
        return {"baseline": self.baseline_params, "best": best}

    def finish(self, stopped: str, finished: "Finished | None",
               attribution: "Attribution | None" = None) -> SearchResult:
        """The search's result (:func:`tuner.tuning.result_builder.result`)."""
        self.events.stop()
        return result_builder.result(self, stopped, finished, attribution)

    def verdicts(self, params: dict[str, Any] | None, metrics: dict[str, Any] | None) -> list[Verdict]:
        """A configuration's verdicts, corrected by every trial measured so far."""
        return config_view.verdicts(self.study, self.recipe.budget.memory_gib, self.environment(), params, metrics,
                                config_view.ran(params, self.pool), self._here(params) if params else None,
                                self.pool.metrics, self.pool.slowdown)

    def _here(self, params: Mapping[str, Any]) -> Here:
        """What this search can run from ``params``, for the advice."""
        r = self.recipe
        return config_view.here(self.space, self.machine, self.config_of, params, r.global_batch_size,
                                r.script.routes() if r.script is not None else None)

    def summary_of(self, params: dict[str, Any] | None, pool: Pool) -> dict[str, Any]:
        return config_view.of(params, pool, self.known)


def _claim(config: Plan) -> str:
    """A configuration as a claim other workers read (:meth:`Workers.claim`)."""
    return repr(searchspace.config_key(config))

