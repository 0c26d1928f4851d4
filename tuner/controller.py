"""The search's distributed controller (``tuner.search``; the command is
``torchrun --nproc_per_node=N -m tuner.search RECIPE.yaml``).

Rank 0 owns the Optuna study and decides; every decision (the next trial's knobs, or
stop) is broadcast, every rank runs the trial, results are reduced to rank 0, and only
rank 0 writes. The loop is the method: the baseline first, then one change at a time from
the best so far (more loader workers while the loop waits on data, then each knob), then
TPE, always with the memory budget as a constraint; duplicates answered from what was
already measured; slow trials pruned; stop at the target or the budget. The winner is then
re-measured against the baseline, interleaved, and the speedup is the ratio of medians.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tuner import attribution as attribution_mod, distributed, engines, interrupt, study as study_mod
from tuner.attribution import Attribution
from tuner.diagnose import Verdict, diagnose_run
from tuner.environment import environment
from tuner.errors import RecipeError
from tuner.guard import IMPRECISE, divergence
from tuner.launcher import ScriptTrials
from tuner.metrics import METRIC_NAMES, Window
from tuner.recipe import Recipe, load_recipe
from tuner.space import Config, Machine, make_config, parse_knobs
from tuner.trial import TrialResult, run_trial

PRUNE_BELOW = 0.5
"""A trial whose first measured steps run below this fraction of the best so far is cut."""
FINALISTS = 3
"""Configurations re-measured in the confirmation: one noisy search trial must not pick
the winner (seen on the benchmark: the true best was found, then outrun by a lucky
measurement of a configuration 20% slower)."""
MAX_RESAMPLES = 50
"""Times the sampler may propose an already-measured configuration before the space is
considered exhausted."""


@dataclass
class SearchResult:
    """What a search found; ``best``/``baseline`` hold ``{"params", "metrics"}``."""

    out: Path
    best: dict[str, Any]
    baseline: dict[str, Any]
    speedup: float | None
    target_met: bool
    stopped: str
    """Why the search stopped: target, trials, minutes, exhausted, interrupted."""
    trials: int
    """Trials measured in the study (all runs of this command together)."""
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    diagnosis: dict[str, list[Verdict]] = field(default_factory=dict)
    """``baseline`` and ``best``: why each runs at its speed (:mod:`tuner.diagnose`)."""
    attribution: Attribution | None = None
    """Which knob bought how much, baseline to best (:mod:`tuner.attribution`)."""


def search(
    recipe: Recipe | str | os.PathLike[str],
    *,
    trials: int | None = None,
    minutes: float | None = None,
    confirm: int = 3,
    attribute: int | None = None,
    out: str | os.PathLike[str] | None = None,
    storage: str | None = None,
    overrides: Sequence[str] = (),
    quiet: bool = False,
    **knobs: Any,
) -> SearchResult | None:
    """Search a recipe's space; returns the result on rank 0 (``None`` on other ranks).

    Args:
        recipe: a recipe path or a loaded :class:`~tuner.recipe.Recipe`.
        trials / minutes: override ``budget.trials`` / ``budget.minutes``.
        confirm: times the finalists and the baseline are re-measured, interleaved
            (0 skips confirmation and reports the search trials' own numbers).
        attribute: repeats of each configuration on the baseline-to-best attribution path
            and of each leave-one-out (default: ``confirm``; 0 skips the attribution).
        out / storage: override the run folder / the Optuna storage URL.
        overrides: ``key=value`` recipe overrides, as ``--set``.
        quiet: no live table on the terminal (the log file is still written).
        **knobs: knobs to fix for the whole search.
    """
    ctx = distributed.context()
    if isinstance(recipe, Recipe):
        recipe = dataclasses.replace(recipe, knob_overrides={**recipe.knob_overrides, **parse_knobs(knobs, "knobs")})
    else:
        recipe = load_recipe(recipe, overrides, world_size=ctx.world_size, knobs=knobs)
    budget = dataclasses.replace(
        recipe.budget,
        trials=trials if trials is not None else recipe.budget.trials,
        minutes=minutes if minutes is not None else recipe.budget.minutes,
    )
    out_dir = Path(out) if out is not None else recipe.out
    if out is not None and storage is None and recipe.storage == f"sqlite:///{recipe.out / 'study.db'}":
        storage = f"sqlite:///{out_dir / 'study.db'}"
    recipe = dataclasses.replace(recipe, budget=budget, out=out_dir, storage=storage or recipe.storage)

    if recipe.script is not None and ctx.world_size > 1:
        raise RecipeError(f"script: run a script recipe's search as one process (python -m tuner.search "
                          f"{recipe.path}); each trial launches torchrun with nproc_per_node itself")
    with interrupt.catching():
        return _search(recipe, ctx, confirm, attribute, quiet)


def _search(recipe: Recipe, ctx: distributed.DistContext, confirm: int, attribute: int | None,
            quiet: bool) -> SearchResult | None:
    machine = Machine.detect()
    space = study_mod.build_space(recipe, machine)
    planner = _Planner(recipe, space, machine, quiet) if ctx.is_main else None
    scripts = ScriptTrials(recipe, recipe.out) if recipe.script is not None else None
    stopped = "interrupted"
    confirmed: Confirmation | None = None
    attribution: Attribution | None = None
    try:
        while True:
            order = distributed.broadcast(planner.next() if planner else None)
            if order["stop"]:
                stopped = order["stop"]
                break
            config, _ = make_config(order["knobs"], recipe.global_batch_size, recipe.world_size, machine, recipe.engine)
            # Every rank must take part in the pruning decision, which rank 0 makes.
            prune = (planner.prune if planner else _never) if order["prune"] else None
            if order.get("reference") and scripts is None:  # the guard needs an fp32 curve first
                ref_result = _run(recipe, dataclasses.replace(config, amp_dtype="fp32"), ctx, scripts)
                if planner:
                    planner.set_reference(ref_result)
            result = _run(recipe, config, ctx, scripts, prune=prune)
            if planner:
                planner.record(result)
        if stopped != "interrupted":
            confirmed = _confirm(recipe, ctx, planner, confirm, scripts)
            attribution = _attribute(recipe, ctx, planner, confirm if attribute is None else attribute, machine,
                                     confirmed, scripts)
    except KeyboardInterrupt:
        if planner is None:
            raise
        planner.interrupted()
        stopped, confirmed, attribution = "interrupted", None, None
    if planner is None:
        return None
    if interrupt.pressed():  # a Ctrl-C Python dropped on the way (see tuner.interrupt)
        stopped, confirmed, attribution = "interrupted", None, None
    with interrupt.deferred():
        return planner.finish(stopped, confirmed, attribution)


class _Planner:
    """Rank 0's side: the study, the budget, the live display, the outputs."""

    def __init__(self, recipe: Recipe, space: study_mod.Space, machine: Machine, quiet: bool) -> None:
        from tuner.live import Live

        self.recipe, self.space, self.machine = recipe, space, machine
        recipe.out.mkdir(parents=True, exist_ok=True)
        self.live = Live(recipe, quiet)
        for note in space.notes:
            self.live.note(note)
        self.study, stale = study_mod.open_study(recipe, recipe.storage, recipe.seed)
        if stale:
            self.live.note(f"{stale} trial(s) left running by an interrupted search recorded as failed")
        self.baseline = study_mod.baseline_knobs(recipe, space, machine)
        self.baseline_config = self._config(self.baseline)
        self.started = time.monotonic()
        self.earlier_s = sum(t.duration.total_seconds() for t in study_mod.measured(self.study) if t.duration)
        self.trial: Any = None
        self.current: Config | None = None
        self.prune: Any = None
        """The pruning rule for the trial in flight (``None``: no best to compare with yet)."""
        self.known = {study_mod.config_key(Config(**study_mod.config_of(t))): t  # type: ignore[arg-type]
                      for t in study_mod.measured(self.study)}
        self.reference: list[float] | None = next(
            (t.user_attrs["losses"] for t in study_mod.feasible(self.study)
             if t.user_attrs["params"].get("amp_dtype") == "fp32" and t.user_attrs.get("losses")), None)
        """fp32 loss per step, for the precision guard (from a resumed study, if it has one)."""
        self.notes_seen: set[str] = set()
        if not self.known:
            self.study.enqueue_trial(self.baseline, user_attrs={"baseline": True}, skip_if_exists=True)
        self.live.start(self._done(), len(self.known))

    # --- decisions ------------------------------------------------------------------------

    def next(self) -> dict[str, Any]:
        stop = "interrupted" if interrupt.pressed() else self._stop_reason()
        if stop:
            return {"stop": stop}
        guided = self._guided()
        if guided is not None:
            self.study.enqueue_trial(guided, user_attrs={"guided": True})
        for _ in range(MAX_RESAMPLES):
            trial = self.study.ask()
            knobs = study_mod.suggest(trial, self.space, self.baseline)
            config = self._config(knobs)
            seen = self.known.get(study_mod.config_key(config))
            if seen is None:
                self.trial, self.current = trial, config
                self.prune = self.prune_rule()
                self.live.begin(trial.number, config)
                reference = config.amp_dtype != "fp32" and self.reference is None
                return {"stop": None, "knobs": knobs, "prune": self.prune is not None, "reference": reference}
            self._answer_duplicate(trial, seen)
        return {"stop": "exhausted"}

    def _guided(self) -> dict[str, Any] | None:
        """The next one-knob-at-a-time step from the best so far, if any is left."""
        best = study_mod.best_feasible(self.study)
        if best is None:
            return None
        return study_mod.guided_next(
            self.space, best.user_attrs["params"], best.user_attrs["metrics"],
            lambda knobs: study_mod.config_key(self._config(knobs)) in self.known,
        )

    def prune_rule(self) -> Any:
        best = study_mod.best_feasible(self.study)
        if best is None or self.trial is None:
            return None
        threshold, trial, world = best.value * PRUNE_BELOW, self.trial, self.recipe.world_size

        def rule(window: Window) -> bool:
            rate = sum(window.samples) * world / sum(window.step_times)
            trial.report(rate, len(window.step_times))
            return rate < threshold

        return rule

    def set_reference(self, result: TrialResult) -> None:
        """The fp32 loss curve the precision guard compares with (an extra trial, run
        only when the first reduced-precision trial comes before any fp32 one)."""
        if result.ok and result.losses:
            self.reference = result.losses
            self.live.note("precision guard: measured an fp32 reference curve for bf16/fp16 trials")
        else:
            self.live.note(f"precision guard: the fp32 reference did not run ({result.state}: {result.reason}); "
                           "bf16/fp16 trials are not checked")
            self.reference = []

    def record(self, result: TrialResult) -> None:
        assert self.trial is not None and self.current is not None
        if result.ok and self.current.amp_dtype == "fp32" and not self.reference and result.losses:
            self.reference = result.losses
        elif result.ok and self.current.amp_dtype != "fp32" and self.reference:
            why = divergence(result.losses, self.reference, self.recipe.precision.tolerance, self.current.amp_dtype)
            if why:
                result = dataclasses.replace(result, state=IMPRECISE, reason=why)
        for note in result.notes:
            if note not in self.notes_seen and self.current.micro_batch_size != self.baseline_config.micro_batch_size:
                self.notes_seen.add(note)
                self.live.note(note)
        extra = {"baseline": True} if self.current == self.baseline_config else {}
        outcome = study_mod.record(self.study, self.trial, result, self.recipe, extra)
        frozen = self.study._storage.get_trial(self.trial._trial_id)
        self.known[study_mod.config_key(self.current)] = frozen
        self.live.finish_trial(frozen, outcome, self._best_value())
        self.trial = self.current = None

    def interrupted(self) -> None:
        if self.trial is not None:
            from optuna.trial import TrialState

            self.trial.set_user_attr("state", "error")
            self.trial.set_user_attr("reason", "interrupted (Ctrl-C)")
            self.study.tell(self.trial, state=TrialState.FAIL)
            self.trial = None

    # --- stopping -------------------------------------------------------------------------

    def _done(self) -> int:
        return len(study_mod.measured(self.study))

    def _elapsed_s(self) -> float:
        return self.earlier_s + time.monotonic() - self.started

    def _best_value(self) -> float | None:
        best = study_mod.best_feasible(self.study)
        return best.value if best else None

    def _stop_reason(self) -> str | None:
        b, target = self.recipe.budget, self.recipe.target
        best = study_mod.best_feasible(self.study)
        if best is not None and _meets(best.user_attrs["metrics"], target):
            return "target"
        done = self._done()
        if done >= b.trials:
            return "trials"
        if b.minutes is not None:
            durations = [t.duration.total_seconds() for t in study_mod.measured(self.study) if t.duration]
            expected = statistics.median(durations) if durations else 0.0
            if self._elapsed_s() + expected > b.minutes * 60:
                return "minutes"
        return None

    def _answer_duplicate(self, trial: Any, seen: Any) -> None:
        """Tell the sampler what it proposed again, without measuring it again."""
        from optuna.trial import TrialState

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

    def _config(self, knobs: dict[str, Any]) -> Config:
        r = self.recipe
        return make_config(knobs, r.global_batch_size, r.world_size, self.machine, r.engine)[0]

    # --- the end --------------------------------------------------------------------------

    def finalists(self) -> list[dict[str, Any]]:
        """The best distinct feasible configurations by their search trial, best first."""
        ranked = sorted(study_mod.feasible(self.study), key=lambda t: t.value, reverse=True)
        return [t.user_attrs["params"] for t in ranked[:FINALISTS]]

    def attribution_plan(self, confirmed: Confirmation | None) -> dict[str, Any] | None:
        """The two ends of the attribution: the baseline's and the winner's knobs."""
        best = confirmed.winner if confirmed is not None else None
        if best is None:
            trial = study_mod.best_feasible(self.study)
            best = trial.user_attrs["params"] if trial is not None else None
        base = self.baseline_config.params()
        if best is None or not any(t.user_attrs.get("baseline") and t.user_attrs.get("state") == "ok"
                                   for t in study_mod.measured(self.study)):
            return None
        return {"baseline": base, "best": best}

    def finish(self, stopped: str, confirmed: Confirmation | None, attribution: Attribution | None = None) -> SearchResult:
        from tuner import outputs

        self.live.stop()
        best_trial = study_mod.best_feasible(self.study)
        if confirmed is not None:
            best_trial = next(t for t in study_mod.feasible(self.study) if t.user_attrs["params"] == confirmed.winner)
        baseline_trial = next((t for t in study_mod.measured(self.study) if t.user_attrs.get("baseline")), None)
        best = _summary(best_trial, confirmed, "best")
        base = _summary(baseline_trial, confirmed, "baseline")
        speedup = None
        if best["metrics"] and base["metrics"]:
            speedup = best["metrics"]["samples_per_s"] / base["metrics"]["samples_per_s"]
        target_met = bool(best["metrics"]) and _meets(best["metrics"], self.recipe.target)
        env = environment(self.recipe.world_size)
        budget = self.recipe.budget.memory_gib
        result = SearchResult(
            out=self.recipe.out, best=best, baseline=base, speedup=speedup, target_met=target_met,
            stopped=stopped, trials=self._done(), environment=env,
            notes=list(self.space.notes),
            diagnosis={name: diagnose_run(part["metrics"], part["params"], budget, env)
                       for name, part in (("baseline", base), ("best", best))},
            attribution=attribution,
        )
        outputs.write_run(result, self.recipe, self.study, self.machine)
        # The report is rebuilt from the study alone: keep what the end of the search knew there.
        self.study.set_user_attr("result", outputs.result_record(result, self.recipe))
        outputs.write_report(self.recipe.out, self.study)
        self.live.summary(result)
        return result


def _never(window: Window) -> bool:
    """Other ranks' stand-in for rank 0's pruning rule (rank 0 decides, all follow)."""
    return False


@dataclass
class Confirmation:
    winner: dict[str, Any]
    """The finalist with the best median: the search's answer."""
    runs: dict[str, list[TrialResult]]
    """``best`` and ``baseline`` confirmation runs."""


def _confirm(recipe: Recipe, ctx: distributed.DistContext, planner: _Planner | None,
             repeats: int, scripts: ScriptTrials | None = None) -> Confirmation | None:
    """The finalists and the baseline, interleaved ``repeats`` times: the same minutes, the
    same noise. The finalist with the best median becomes ``best``."""
    order = distributed.broadcast(
        {"finalists": planner.finalists(), "baseline": planner.baseline_config.params()} if planner else None
    )
    if repeats < 1 or not order["finalists"]:
        return None
    configs = [Config(**p) for p in order["finalists"]]
    baseline = Config(**order["baseline"])
    if planner:
        planner.live.note(f"confirming: {len(configs)} finalist(s) and the baseline, interleaved, {repeats} time(s) each")
    runs: dict[Config, list[TrialResult]] = {c: [] for c in [baseline, *configs]}
    for _ in range(repeats):
        for config in runs:
            runs[config].append(_run(recipe, config, ctx, scripts))

    def median_rate(config: Config) -> float:
        rates = [r.metrics["samples_per_s"] for r in runs[config] if r.ok and r.metrics]
        return statistics.median(rates) if rates else 0.0

    winner = max(configs, key=median_rate)
    return Confirmation(winner=winner.params(), runs={"best": runs[winner], "baseline": runs[baseline]})


def _attribute(recipe: Recipe, ctx: distributed.DistContext, planner: _Planner | None, repeats: int,
               machine: Machine, confirmed: Confirmation | None,
               scripts: ScriptTrials | None = None) -> Attribution | None:
    """Every configuration on the baseline-to-best path and every leave-one-out, measured
    ``repeats`` times, interleaved (the same minutes, the same noise for all)."""
    plan = distributed.broadcast(planner.attribution_plan(confirmed) if planner and repeats > 0 else None)
    if not plan:
        return None
    base, best = plan["baseline"], plan["best"]
    configs = {attribution_mod.key(c): c for _, c in attribution_mod.path(base, best)}
    configs.update({attribution_mod.key(c): c for _, c in attribution_mod.leave_one_out(base, best)})
    if len(configs) < 2:
        return None
    if planner:
        planner.live.note(f"attributing the gain: {len(configs)} configurations, interleaved, {repeats} time(s) each")
    rates: dict[str, list[float]] = {k: [] for k in configs}
    failures: dict[str, str] = {}
    batch_norm = False
    for _ in range(repeats):
        for k, knobs in configs.items():
            if k in failures:
                continue
            config, _ = make_config({n: knobs[n] for n in attribution_mod.ORDER if n in knobs},
                                    recipe.global_batch_size, recipe.world_size, machine, recipe.engine)
            result = _run(recipe, config, ctx, scripts)
            batch_norm = batch_norm or any("BatchNorm" in n for n in result.notes)
            if result.ok and result.metrics:
                rates[k].append(result.metrics["samples_per_s"])
            else:
                failures[k] = f"{result.state}: {result.reason}"
    return attribution_mod.attribute(base, best, rates, failures, batch_norm) if planner else None


def _run(recipe: Recipe, config: Config, ctx: distributed.DistContext, scripts: ScriptTrials | None,
         prune: Any = None) -> TrialResult:
    """One trial: in this process (a task recipe, on every rank) or the user's script in a
    process tree of its own (a script recipe; no pruning there)."""
    if scripts is not None:
        return scripts.run(config)
    engines.prepare(config, ctx.device)
    return run_trial(recipe, config, ctx, prune=prune)


def _summary(trial: Any, confirmed: Confirmation | None, name: str) -> dict[str, Any]:
    """Params and metrics of best/baseline: the median of the confirmation runs when there
    are any that succeeded, else the search trial's own measurement."""
    if trial is None:
        return {"params": None, "metrics": None, "source": None}
    all_runs = confirmed.runs[name] if confirmed is not None else []
    runs = [r.metrics for r in all_runs if r.ok and r.metrics]
    if runs:
        metrics = {k: (statistics.median([m[k] for m in runs if m[k] is not None])
                       if any(m[k] is not None for m in runs) else None) for k in METRIC_NAMES}
        failures = sum(not r.ok for r in all_runs)
        return {"params": trial.user_attrs["params"], "metrics": metrics,
                "source": f"median of {len(runs)} confirmation runs",
                "failures": failures, "trial": trial.number}
    return {"params": trial.user_attrs["params"], "metrics": trial.user_attrs["metrics"],
            "source": "search trial", "trial": trial.number}


def _meets(metrics: dict[str, Any] | None, target: Any) -> bool:
    if not metrics:
        return False
    if target.samples_per_s is not None and metrics["samples_per_s"] >= target.samples_per_s:
        return True
    tps = metrics.get("tokens_per_s")
    return target.tokens_per_s is not None and tps is not None and tps >= target.tokens_per_s

