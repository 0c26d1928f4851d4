"""Rank 0's side of a search: the study, the budget, what to measure next.

The loop is the method: the baseline first, then one change at a time from the best so
far (:mod:`tuner.tuning.guided`), then TPE, always with the memory budget as a
constraint; a configuration proposed again is answered from what was already measured,
never measured twice; slow trials are pruned (:mod:`tuner.tuning.budget`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from optuna.trial import TrialState

from tuner.analysis.diagnose import Verdict
from tuner.analysis.guard import divergence
from tuner.config.space import Config, Machine, make_config, numerics
from tuner.harness.system.environment import environment
from tuner.memory import model as memory
from tuner.study import records as study_mod
from tuner.study import searchspace, workers
from tuner.study.workers import Workers, fingerprint
from tuner.trial.trial_result import State, TrialResult
from tuner.tuning import answer, budget, guided, recommend, summary
from tuner.tuning.broken import why_broken
from tuner.tuning.convergence import Convergence
from tuner.tuning.events import SearchEvents
from tuner.tuning.finalists import FINALISTS, TIME_SHARE
from tuner.tuning.pool import Pool
from tuner.tuning.search_result import SearchResult

if TYPE_CHECKING:
    import optuna

    from tuner.analysis.attribution import Attribution
    from tuner.config.recipe import Recipe
    from tuner.runner import Runner
    from tuner.trial.trial_result import PruneRule
    from tuner.tuning.finalists import Confirmation

MAX_RESAMPLES = 50
"""Times the sampler may propose a measured configuration before the space counts as exhausted."""


class Decider:
    """Decides each next trial on rank 0 and records what every trial gave."""

    def __init__(self, recipe: "Recipe", space: searchspace.Space, machine: Machine, events: SearchEvents,
                 pool: Pool | None = None, runner: "Runner | None" = None) -> None:
        self.recipe, self.space, self.machine, self.events, self.runner = recipe, space, machine, events, runner
        self.pool = pool if pool is not None else Pool()
        self.convergence = Convergence(self.pool, recipe.tolerance)
        self._environment: dict[str, Any] | None = None
        self.pruned, self.saved_s = 0, 0.0
        self.broken: str | None = None
        """Why the search stopped as ``broken`` (:meth:`_broken`)."""
        """Trials pruned in this run, and the measuring seconds that saved (estimated)."""
        for note in space.notes:
            events.note(note)
        self.study, stale = study_mod.open_study(recipe.name, recipe.storage, recipe.seed)
        if stale:
            events.note(f"{stale} trial(s) left running by an interrupted search recorded as failed")
        self.workers = Workers(self.study, events.note, lambda: recipe.budget.trials - len(budget.ran(self.study)))
        self.baseline = searchspace.baseline_knobs(recipe, space, machine)
        self.points = searchspace.every_key(space, recipe, machine)
        self.baseline_config = self._config(self.baseline)
        self.started = time.monotonic()
        self.earlier_s = sum(t.duration.total_seconds() for t in study_mod.measured(self.study) if t.duration)
        self.trial: optuna.Trial | None = None
        self.current: Config | None = None
        self.prune: PruneRule | None = None
        """The pruning rule for the trial in flight (``None``: no best to compare with yet)."""
        self.known = self._known()
        self.reference: list[float] | None = next(
            (t.user_attrs["losses"] for t in study_mod.feasible(self.study)
             if numerics(t.user_attrs["params"]) is None and t.user_attrs.get("losses")), None)
        """The reference loss per step (fp32, eager), for the precision guard (from a resumed
        study, if it has one)."""
        self.notes_seen: set[str] = set()
        self.memory, why = memory.model_for(recipe.task, recipe.task_args, recipe.world_size, not machine.cuda,
                                           study_mod.measured(self.study), recipe.global_batch_size)
        """Predicts each trial's peak before it runs (:mod:`tuner.memory.model`)."""
        if why:
            events.note(why)
        if not self.known:
            self.study.enqueue_trial(self.baseline, user_attrs={"baseline": True}, skip_if_exists=True)
            if self.memory is not None:
                self._seed(*memory.feed_plan(self.memory, recipe.out, recipe.path))
        events.start(self.done(), len(self.known))

    def _seed(self, fed: int, note: str | None) -> None:
        """Right after the baseline, the largest micro-batch ``tuner plan``'s profile predicts
        to fit the budget (the baseline's other knobs), unless prediction is off."""
        if note:
            self.events.note(note)
        limit = self.recipe.budget.memory_gib
        if not fed or limit is None or not self.recipe.budget.skip or self.memory is None:
            return
        micro, gib = memory.largest_fitting(self.memory, self.baseline_config.params(),
                                            list(self.space.choices["micro_batch_size"]), limit)
        if micro is not None and micro != self.baseline_config.micro_batch_size:
            self.study.enqueue_trial({**self.baseline, "micro_batch_size": micro}, user_attrs={
                "guided": True, "why": f"tuner plan: micro-batch {micro} is the largest predicted to fit "
                                       f"({gib:.2f} GiB <= {limit:g} GiB)"})

    # --- decisions ------------------------------------------------------------------------

    def next(self, interrupted: bool) -> dict[str, Any]:
        """The next order for every rank: the knobs of a trial, or why to stop. Configurations
        the memory model predicts over the budget are recorded ``skipped`` on the way."""
        for _ in range(MAX_RESAMPLES):
            order = self._next(interrupted)
            if not order.get("skipped"):
                return order
        return {"stop": "exhausted"}

    def _next(self, interrupted: bool) -> dict[str, Any]:
        self.workers.reap()
        self.known, flying = self._known(), self.workers.elsewhere()
        stop = "interrupted" if interrupted else budget.stop_reason(
            self.study, self.recipe.budget, self.recipe.target, self._elapsed_s(), len(flying))
        if stop is None and self.points is not None and self.points <= set(self.known) and not flying:
            stop, said = "exhausted", f"exhausted: all {len(self.points)} configurations of the space are measured"
            self._once(said)  # asked again after the other workers' trials
        if stop is None and (broken := why_broken(study_mod.measured(self.study), self.runner)):
            self.broken = broken
            self.events.note(f"stopped: {broken}")
            return {"stop": "broken"}
        if stop or self.workers.finishing_elsewhere():
            return {"stop": stop or "finishing elsewhere"}
        if self.workers.lost_baseline(_claim(self.baseline_config), set(self.known)):
            self.study.enqueue_trial(self.baseline, user_attrs={"baseline": True})
        best = study_mod.best_feasible(self.study)
        step = guided.guided_next(
            self.space, best.user_attrs["params"], best.user_attrs["metrics"],
            lambda knobs: searchspace.config_key(self._config(knobs)) in self.known or _claim(self._config(knobs))
            in flying,
            self.verdicts(best.user_attrs["params"], best.user_attrs["metrics"]),
            self._outcome,
        ) if best is not None else None
        repeat = self.convergence.repeat(best) if step is None and best is not None and \
            self.recipe.budget.converge else None
        if repeat is not None:
            if self.convergence.repeats == 1:
                self.events.note("the neighbourhood of the best is measured: measuring the best again to learn this "
                                 "machine's noise, which the convergence stop reads (the confirmation reuses it)")
            return {"stop": None, "repeat": repeat}
        if step is None and self.recipe.budget.converge and \
                self.convergence.converged(self.space.size(), len(self.known)):
            said = (f"converged: the neighbourhood of the best is measured and the sampler's last "
                    f"{self.convergence.streak} "
                    f"trials were each shown no gain beyond the {self.recipe.tolerance:.0%} tolerance over the best")
            self._once(said)  # asked again once this worker leads the finish
            return {"stop": "converged"}
        if step is not None:
            self.study.enqueue_trial(step.knobs, user_attrs={"guided": True, "why": step.why})
        self.convergence.sampled = step is None and best is not None
        for _ in range(MAX_RESAMPLES):
            trial = workers.ask(self.study, self.workers.me)
            knobs = searchspace.suggest(trial, self.space, self.baseline, self.recipe.world_size)
            config = self._config(knobs)
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
                self.prune = budget.prune_rule(best.value, self.recipe.world_size, self.recipe.tolerance,
                                               self.pool.known_noise()) if best is not None and \
                    config != self.baseline_config else None  # the baseline, run late by a worker, is what compares
                self.events.chose(trial.number, _chosen_by(trial))
                self.events.begin(trial.number, config)
                reference = numerics(config.params()) is not None and self.reference is None
                return {"stop": None, "knobs": knobs, "prune": self.prune is not None, "reference": reference}
            self._answer_duplicate(trial, seen)
        return {"stop": "exhausted"}

    def _predict(self, trial: "optuna.Trial", config: Config) -> bool:
        """Record the trial ``skipped`` (True) when its parallel layout cannot run (the rule
        said), or when the memory model is sure enough that it would break the budget. The
        baseline always runs: it is what is compared with."""
        refused = self.space.refusal(config.params(), self.recipe.world_size, self.recipe.global_batch_size)
        if refused is not None:  # an impossible layout: said with its rule, never run, not counted
            self.events.chose(trial.number, _chosen_by(trial))
            self.record(TrialResult(config.params(), State.SKIPPED, f"refused: {refused}"))
            return True
        if self.memory is None:
            return False
        predicted = self.memory.predict(config.params())
        trial.set_user_attr("predicted_peak_gib", predicted.peak_gib)
        trial.set_user_attr("prediction", predicted.basis)
        why = self.memory.skip_reason(predicted, self.recipe.budget.memory_gib)
        if why is None or not self.recipe.budget.skip or trial.user_attrs.get("baseline"):
            return False
        self.events.chose(trial.number, _chosen_by(trial))
        self.record(TrialResult(config.params(), State.SKIPPED, why))
        return True

    def set_reference(self, result: TrialResult) -> None:
        """The fp32 loss curve the precision guard compares with (an extra trial, run only
        when the first reduced-precision trial comes before any fp32 one, batches in order)."""
        if result.ok and result.losses:
            self.reference = result.losses
            self.events.note("precision guard: measured an fp32 reference curve (eager, every guarded lever at its "
                             "reference) for the trials that change the arithmetic")
        else:
            self.events.note(f"precision guard: the fp32 reference did not run ({result.state}: {result.reason}); "
                             "trials that change the arithmetic are not checked")
            self.reference = []

    def record(self, result: TrialResult) -> None:
        assert self.trial is not None and self.current is not None
        label = numerics(self.current.params())
        if result.ok and label is None and not self.reference and result.losses and self.current.in_order:
            self.reference = result.losses
        elif result.state in (State.OK, State.PRUNED) and label is not None and self.reference and result.losses:
            # a pruned trial whose curve already left the reference is imprecise, not just slow
            tolerance, ordered = self.recipe.precision.tolerance, self.current.in_order
            why = divergence(result.losses, self.reference, tolerance, label, ordered)
            if why:
                result = dataclasses.replace(result, state=State.IMPRECISE, reason=why)
        changed_micro = self.current.micro_batch_size != self.baseline_config.micro_batch_size
        for note in result.notes:  # each once; BatchNorm's only where the micro-batch changed
            if changed_micro or "BatchNorm" not in note:
                self._once(note)
        extra: dict[str, Any] = {"env": fingerprint(self._env())}
        if self.current == self.baseline_config:
            extra["baseline"] = True
        best_before = study_mod.best_feasible(self.study)
        outcome, frozen = study_mod.record(self.study, self.trial, result, self.recipe.budget, extra)
        if self.memory is not None and result.metrics and result.metrics.get("peak_mem_gib"):
            self.memory.observe(self.current.params(), frozen.user_attrs.get("predicted_peak_gib"),
                                result.metrics["peak_mem_gib"], frozen.user_attrs.get("prediction"),
                                process_gib=result.metrics.get("gpu_mem_process_gib"))
        self.convergence.record(best_before, frozen)
        if result.pruned_at is not None:
            self._count_saving(*result.pruned_at)
        self.known[searchspace.config_key(self.current)] = frozen
        self.events.finish_trial(frozen, outcome, self._best_value())
        self.trial = self.current = None
        self.workers.end()

    def _once(self, note: str) -> None:
        """Say ``note`` in the search log, once however often it comes up."""
        if note not in self.notes_seen:
            self.notes_seen.add(note)
            self.events.note(note)

    def record_hung(self, reason: str) -> None:
        """The trial in flight ran past its limit (:mod:`tuner.trial.watchdog`): recorded, never run again."""
        if self.trial is not None and self.current is not None:
            self.record(TrialResult(self.current.params(), State.HUNG, reason))

    def _count_saving(self, steps: int, rate: float) -> None:
        """A pruned trial skipped the rest of its window and the steps after it."""
        self.pruned += 1
        self.saved_s += budget.pruning_saved_s(
            self.recipe.steps, self.recipe.global_batch_size, self.pool, steps, rate)

    def interrupted(self) -> None:
        """The trial in flight (if any) is recorded as failed: Ctrl-C ended it."""
        if self.trial is not None:
            self.trial.set_user_attr("state", State.ERROR.value)
            self.trial.set_user_attr("reason", "interrupted (Ctrl-C)")
            self.study.tell(self.trial, state=TrialState.FAIL)
            self.trial = None
        self.workers.end()

    def _answer_duplicate(self, trial: "optuna.Trial", seen: "optuna.trial.FrozenTrial") -> None:
        """Tell the sampler what it proposed again, without measuring it again."""
        for key in ("state", "reason", "metrics", "params"):
            if key in seen.user_attrs:
                trial.set_user_attr(key, seen.user_attrs[key])
        if "constraint" in seen.user_attrs:
            study_mod.set_constraint(trial, seen.user_attrs["constraint"])
        trial.set_user_attr("duplicate_of", seen.number)
        if seen.state == TrialState.COMPLETE:
            self.study.tell(trial, seen.value)
        else:
            self.study.tell(trial, state=seen.state if seen.state != TrialState.RUNNING else TrialState.FAIL)

    def _outcome(self, knobs: dict[str, Any]) -> str | None:
        """The state a configuration was recorded with, if it was measured."""
        seen = self.known.get(searchspace.config_key(self._config(knobs)))
        return seen.user_attrs.get("state") if seen is not None else None

    def _config(self, knobs: dict[str, Any]) -> Config:
        r = self.recipe
        return make_config(knobs, r.global_batch_size, r.world_size, self.machine, r.engine, strict=False)[0]

    def _known(self) -> dict[tuple, "optuna.trial.FrozenTrial"]:
        """Every configuration measured in the study (by any worker), by its key."""
        return {searchspace.config_key(Config(**study_mod.config_of(t))): t  # type: ignore[arg-type]
                for t in study_mod.measured(self.study)}

    def done(self) -> int:
        return len(study_mod.measured(self.study))

    def _elapsed_s(self) -> float:
        return self.earlier_s + time.monotonic() - self.started

    def finish_seconds(self) -> float:
        """How long the finish may measure: its share of the search's time so far."""
        return TIME_SHARE * self._elapsed_s()

    def without_all(self, best: dict[str, Any], fastest: dict[str, Any],
                    attribution: "Attribution | None") -> dict[str, Any] | None:
        """The answer without every change the rule drops, when there are several (what the
        finish measures against the fastest before dropping them together)."""
        knobs = recommend.droppable(best, fastest, attribution, self.pool, self.baseline_config.params(),
                                    self._config, self.recipe, self.reference, self.space)
        return recommend.together(best, knobs, self.baseline_config.params(), self._config) if len(knobs) > 1 else None

    def _env(self) -> dict[str, Any]:
        if self._environment is None:
            self._environment = environment(self.recipe.world_size)
        return self._environment

    def _best_value(self) -> float | None:
        best = study_mod.best_feasible(self.study)
        return best.value if best else None

    # --- the end --------------------------------------------------------------------------

    def finalists(self) -> list[dict[str, Any]]:
        """The best distinct feasible configurations by their search trial, best first."""
        ranked = sorted(study_mod.feasible(self.study), key=lambda t: t.value, reverse=True)
        return [t.user_attrs["params"] for t in ranked[:FINALISTS]]

    def attribution_plan(self, confirmed: "Confirmation | None") -> dict[str, Any] | None:
        """The two ends of the attribution: the baseline's and the winner's knobs."""
        best = confirmed.winner if confirmed is not None else None
        if best is None:
            trial = study_mod.best_feasible(self.study)
            best = trial.user_attrs["params"] if trial is not None else None
        if best is None or not any(t.user_attrs.get("baseline") and t.user_attrs.get("state") == State.OK
                                   for t in study_mod.measured(self.study)):
            return None
        return {"baseline": self.baseline_config.params(), "best": best}

    def finish(self, stopped: str, confirmed: "Confirmation | None",
               attribution: "Attribution | None" = None) -> SearchResult:
        """The search's result (:func:`tuner.tuning.answer.result`)."""
        self.events.stop()
        return answer.result(self, stopped, confirmed, attribution)

    def verdicts(self, params: dict[str, Any] | None, metrics: dict[str, Any] | None) -> list[Verdict]:
        """A configuration's verdicts, corrected by every trial measured so far."""
        return summary.verdicts(self.study, self.recipe.budget.memory_gib, self._env(), params, metrics,
                                summary.ran(params, self.pool))

    def _summary(self, params: dict[str, Any] | None, pool: Pool) -> dict[str, Any]:
        return summary.of(params, pool, self.known)


def _claim(config: Config) -> str:
    """A configuration as a claim other workers read (:meth:`Workers.claim`)."""
    return repr(searchspace.config_key(config))


def _chosen_by(trial: "optuna.Trial") -> str:
    """What chose a trial, for the search log: a guided step's verdict, the baseline, or TPE."""
    return trial.user_attrs.get("why") or ("the baseline" if trial.user_attrs.get("baseline") else "the sampler (TPE)")
