"""The Python API: ``tuner.measure``, ``tuner.search`` and ``tuner.check`` (the commands'
work, without their argument parsing).

``search`` runs the search (:mod:`tuner.tuning`) and then, on rank 0, writes what it found
(:mod:`tuner.outputs`): the search itself returns its result and writes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from tuner import runner
from tuner.analysis import gate
from tuner.analysis.diagnose import diagnose_run
from tuner.harness import distributed, interrupt
from tuner.harness.caller_state import as_found
from tuner.harness.system.environment import environment
from tuner.inputs.errors import RecipeError
from tuner.inputs.recipe import Recipe, check_tolerance, load_recipe
from tuner.inputs.space import parse_knobs
from tuner.inputs.trackers import parse_track
from tuner.measurement import Measurement, measure_recipe
from tuner.memory.capacity import CapacityPlan, plan_recipe
from tuner.outputs.diagnosis import Worded, worded
from tuner.trial.trial_result import Instruments
from tuner.tuning.search_result import SearchResult

if TYPE_CHECKING:
    from tuner.scriptmode.probe import Probe

__all__ = ["CapacityPlan", "Measurement", "SearchResult", "check", "measure", "plan", "search"]


_F = TypeVar("_F", bound=Callable[..., Any])


def _as_found(call: _F) -> _F:
    """The call leaves the caller's process as it found it (:mod:`tuner.harness.caller_state`)."""
    @functools.wraps(call)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        from tuner.trial.run import frozen_for_the_call

        with as_found(), frozen_for_the_call():
            return call(*args, **kwargs)

    return wrapped  # type: ignore[return-value]


@_as_found
def measure(
    recipe: Recipe | str | os.PathLike[str],
    *,
    repeats: int | None = None,
    overrides: Sequence[str] = (),
    trace: str | os.PathLike[str] | None = None,
    nvtx: bool = False,
    **knobs: Any,
) -> Measurement:
    """Measure one configuration of a recipe.

    Args:
        recipe: a recipe path or a loaded :class:`~tuner.inputs.recipe.Recipe`.
        repeats: trials to run; default the recipe's ``steps.repeats``.
        overrides: ``key=value`` recipe overrides (paths only), as ``--set``.
        trace: a folder for a ``torch.profiler`` trace of the first repeat's measured
            window (``trace_rank<N>.json``, one per rank).
        nvtx: NVTX ranges around the phases of each step (CUDA builds).
        **knobs: knob values (``num_workers=4, amp_dtype="bf16"``); they win over the
            recipe's fixed space values and its baseline.
    """
    from tuner.scriptmode.baseline import own_baseline

    ctx = distributed.context()
    recipe = _load(recipe, overrides, ctx.world_size, knobs)
    recipe, own = own_baseline(recipe)  # a script measured as it runs, where --set says nothing
    for line in own if ctx.is_main else ():
        print(f"tuner: {line}", file=sys.stderr)
    first = Instruments(trace_dir=Path(trace) if trace is not None else None, nvtx=nvtx)
    m = measure_recipe(recipe, ctx, repeats if repeats is not None else recipe.steps.repeats, first,
                       Instruments(nvtx=nvtx))
    return dataclasses.replace(m, diagnosis=[Worded.of(v) for v in m.diagnosis])


@_as_found
def search(
    recipe: Recipe | str | os.PathLike[str],
    *,
    trials: int | None = None,
    minutes: float | None = None,
    confirm: int = 100,
    attribute: int | None = None,
    finish_minutes: float | None = None,
    out: str | os.PathLike[str] | None = None,
    storage: str | None = None,
    overrides: Sequence[str] = (),
    quiet: bool = False,
    explain: bool = False,
    full_budget: bool = False,
    no_skip: bool = False,
    tolerance: float | None = None,
    track: Sequence[str] | str = (),
    began: float | None = None,
    **knobs: Any,
) -> SearchResult | None:
    """Search a recipe's space; returns the result on rank 0 (``None`` on other ranks).

    Args:
        recipe: a recipe path or a loaded :class:`~tuner.inputs.recipe.Recipe`.
        trials / minutes: override ``budget.trials`` / ``budget.minutes``.
        confirm: the most interleaved rounds one question of the finish may take (a
            finalist, a change of the answer, the baseline; 0 skips the finish and reports
            the search trials' own numbers, each change undecided).
        attribute: runs of each configuration on the attribution path not yet measured, inside
            what is left of the finish's budget (default 1; 0 skips the attribution).
        finish_minutes: the finish's budget (default: :data:`tuner.tuning.finish.TIME_SHARE` of
            the search's own time); ``minutes`` bounds search and finish together.
        out / storage: override the run folder / the Optuna storage URL.
        overrides: ``key=value`` recipe overrides, as ``--set``.
        quiet: no live table on the terminal (the log file is still written).
        explain: every decision and finding on the terminal too (search.log has them).
        full_budget: spend the whole budget once converged too (``budget.converge: false``).
        no_skip: run what the memory model predicts over budget (``budget.skip: false``).
        tolerance: override the recipe's ``tolerance``, the largest slowdown a simpler answer
            may cost against the fastest (:mod:`tuner.stats.decision`; default 0.02).
        track: experiment trackers to log to besides the recipe's ``track:``
            (``"mlflow"``, ``"tensorboard"``, ``"wandb"``; a list or comma-separated).
        began: when the command began (``time.monotonic()``; default: this call), which
            ``budget.minutes`` counts from: the command line passes its process's start.
        **knobs: knobs to fix for the whole search.
    """
    from tuner.outputs import run_folder, tracking
    from tuner.outputs.live import Live
    from tuner.scriptmode.baseline import own_baseline
    from tuner.tuning.controller import run_search

    began = time.monotonic() if began is None else began  # budget.minutes bounds the command: the look too
    ctx = distributed.context()
    recipe = _load(recipe, overrides, ctx.world_size, knobs)
    recipe = _for_search(recipe, trials, minutes, full_budget, no_skip, out, storage, tolerance, track)
    tracking.check(recipe.track)
    runner.check_launch(recipe, ctx, "search")
    recipe, said = _gpu_budget(recipe, ctx)
    recipe, own = own_baseline(recipe)  # a script's baseline is what the script runs by itself
    live, events = None, None
    if ctx.is_main:
        recipe.out.mkdir(parents=True, exist_ok=True)
        live = Live(recipe, quiet, explain)
        for line in ([said] if said else []) + own:
            live.note(line)
        events = tracking.Tracked(live, recipe.track, recipe, recipe.out) if recipe.track else live

    def write(result: SearchResult) -> None:
        run_folder.write_run(result)
        if isinstance(events, tracking.Tracked):
            events.finish(result, recipe.out)
        if live is not None:
            live.summary(result)

    helpers = _node_group_workers(recipe, overrides, knobs) if ctx.is_main else []
    try:
        with interrupt.catching():
            return _worded(run_search(recipe, ctx, confirm, attribute, events, finish_minutes, write, began))
    finally:
        _wait_for(helpers)


def _worded(result: SearchResult | None) -> SearchResult | None:
    """The result with each verdict's words beside its record (``print(v)`` says them)."""
    return dataclasses.replace(result, diagnosis=worded(result.diagnosis)) if result is not None else None


def _for_search(recipe: Recipe, trials: int | None, minutes: float | None, full_budget: bool, no_skip: bool,
                out: str | os.PathLike[str] | None, storage: str | None, tolerance: float | None,
                track: Sequence[str] | str) -> Recipe:
    """The recipe with :func:`search`'s arguments applied over it."""
    budget = dataclasses.replace(
        recipe.budget,
        trials=trials if trials is not None else recipe.budget.trials,
        minutes=minutes if minutes is not None else recipe.budget.minutes,
        converge=recipe.budget.converge and not full_budget,
        skip=recipe.budget.skip and not no_skip,
    )
    out_dir = Path(out) if out is not None else recipe.out
    if out is not None and storage is None and recipe.storage == f"sqlite:///{recipe.out / 'study.db'}":
        storage = f"sqlite:///{out_dir / 'study.db'}"
    recipe = dataclasses.replace(recipe, budget=budget, out=out_dir, storage=storage or recipe.storage,
                                 tolerance=recipe.tolerance if tolerance is None else
                                 check_tolerance(tolerance, "--tolerance"),
                                 track=tuple(dict.fromkeys((*recipe.track, *parse_track(
                                     ",".join(track) if not isinstance(track, str) else track, "--track")))))
    return recipe


def _node_group_workers(recipe: Recipe, overrides: Sequence[str], knobs: dict[str, Any]) -> list[Any]:
    """``launcher: slurm`` with ``parallel: N``: one more worker of this study per node group
    after the first (this process takes the first, and finishes the search), each the same
    search command with ``TUNER_SLURM_NODES`` naming its group; logs in ``worker-K.log``."""
    import subprocess
    import sys

    from tuner.scriptmode import slurm
    from tuner.study.workers import FOLLOW_ENV

    script = recipe.script
    if script is None or script.launcher != "slurm" or script.parallel < 2 or os.environ.get(slurm.GROUP_ENV):
        return []
    groups = slurm.worker_groups(script)
    os.environ[slurm.GROUP_ENV] = ",".join(groups[0])
    b = recipe.budget
    cmd = [sys.executable, "-m", "tuner.search", str(recipe.path), "--out", str(recipe.out),
           "--storage", recipe.storage, "--trials", str(b.trials), "--quiet", "--confirm", "0", "--attribute", "0",
           *(["--minutes", str(b.minutes)] if b.minutes else []), *([] if b.converge else ["--full-budget"]),
           *([] if b.skip else ["--no-skip"]),
           *[w for o in (*overrides, *(f"{k}={v}" for k, v in knobs.items())) for w in ("--set", str(o))]]
    started = []
    for i, group in enumerate(groups[1:], start=1):
        log = open(recipe.out / f"worker-{i}.log", "wb")
        env = {**os.environ, slurm.GROUP_ENV: ",".join(group), FOLLOW_ENV: "1"}
        started.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    return started


def _wait_for(helpers: list[Any]) -> None:
    """The node-group workers stop once this one finishes (they see it finishing)."""
    import subprocess

    for proc, log in helpers:
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@_as_found
def _gpu_budget(recipe: Recipe, ctx: distributed.DistContext) -> tuple[Recipe, str | None]:
    """A task recipe's search on GPUs without ``budget.memory_gib``: the budget is what each
    rank's GPU had free at the start plus what its process already holds there, the least
    over the ranks (DESIGN.md), and the search says so once."""
    if not runner.in_process(recipe) or ctx.device.type != "cuda" or recipe.budget.memory_gib is not None:
        return recipe, None
    from tuner.harness.system.devices import least_room

    gib = least_room(ctx.device) / 2**30
    budget = dataclasses.replace(recipe.budget, memory_gib=round(gib, 2))
    return dataclasses.replace(recipe, budget=budget), (
        f"budget: {gib:.1f} GiB per GPU, what was free at the start plus this process's own "
        "(no budget.memory_gib)")


@_as_found
def diagnose(measured: "Probe | Mapping[str, Any]", **knobs: Any) -> list[Worded]:
    """The verdicts on a window a :class:`~tuner.scriptmode.probe.Probe` measured in a loop
    the tuner does not own: the bottleneck, its numbers, what to try next (``print`` each).

    Args:
        measured: the probe (its :meth:`summary`, a collective under torchrun: call this on
            every rank), or a summary already taken.
        **knobs: what the loop runs that the probe cannot see (``amp_dtype="bf16"``,
            ``micro_batch_size=8, grad_accum_steps=4``); the loader's own settings are read
            from the DataLoader the probe watched. Unknown names are refused in one line.
    """
    if isinstance(measured, Mapping):
        metrics, params = dict(measured), {}
    else:
        metrics, params = measured.summary(), dict(getattr(measured, "loader_settings", {}))
    extra = {k: knobs.pop(k) for k in ("grad_accum_steps",) if k in knobs}  # derived, not a knob
    params.update({**parse_knobs(knobs, "diagnose"), **extra})
    found = diagnose_run(metrics, params, None, environment(int(os.environ.get("WORLD_SIZE", "1"))))
    return [Worded.of(v) for v in found]


@_as_found
def plan(
    recipe: Recipe | str | os.PathLike[str],
    *,
    out: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    **knobs: Any,
) -> CapacityPlan | None:
    """What fits, without a search: the largest micro-batch predicted to fit the memory
    budget for each sharding x AMP x checkpointing combination of the recipe's space, from
    the analytic model states and a few short profiled trials (:mod:`tuner.memory.capacity`).

    Rank 0 returns the plan (``None`` on other ranks) and writes ``plan.json`` into the run
    folder (``out``, default the recipe's), where a search of the same recipe then starts
    from what the profile measured.
    """
    from tuner.outputs import run_folder

    ctx = distributed.context()
    recipe = _load(recipe, overrides, ctx.world_size, knobs)
    if not runner.in_process(recipe):
        raise RecipeError(f"plan: {recipe.path} is a script recipe; tuner plan needs a task recipe (it counts "
                          "the model's parameters itself). A search of a script still predicts each trial "
                          "from the peaks it measured")
    if out is not None:
        recipe = dataclasses.replace(recipe, out=Path(out))
    result = plan_recipe(recipe, ctx)
    if result is not None:
        run_folder.write_plan(result, recipe.out)
    return result


@_as_found
def check(
    recipe_path: str | os.PathLike[str],
    against: str | os.PathLike[str],
    tolerance: float = gate.DEFAULT_TOLERANCE,
    rounds: int = gate.DEFAULT_ROUNDS,
    overrides: tuple[str, ...] = (),
    absolute: bool = False,
    process_noise: float | None = None,
) -> gate.CheckResult:
    """Re-measure ``against``'s answer and its baseline interleaved in this run and gate
    the speedup against the recorded one (:mod:`tuner.analysis.gate`; rank 0's result is
    the one to read under torchrun).

    Args:
        tolerance: how much smaller the speedup may be, shown by the interval, before it fails.
        rounds: the most interleaved rounds (answer and baseline once each); it stops as
            soon as the one rule settles.
        absolute: gate the answer's samples/s against the recorded one too, with
            ``process_noise`` (required with it): one run's relative noise between two
            processes of this machine, counted once for each side (another process's rate
            is never judged with one process's noise).
    """
    from tuner.inputs.space import Machine
    from tuner.outputs import wording
    from tuner.tuning.gate_rounds import check_rounds, load_best, record_of

    if not 0 <= tolerance < 1:
        raise RecipeError(f"--tolerance must be in [0, 1), got {tolerance}")
    if rounds < 3:
        raise RecipeError(f"--rounds must be >= 3 (the gate reads this run's noise from its own rounds), got {rounds}")
    if absolute and (process_noise is None or process_noise <= 0):
        raise RecipeError("--absolute needs --process-noise: one run's relative noise between two processes of this "
                          "machine (e.g. 0.05 for 5%), which the record's process and this one each add; without it "
                          "another process's rate cannot be judged")
    ctx = distributed.context()
    recipe = load_recipe(recipe_path, overrides, world_size=ctx.world_size)
    best = load_best(against)
    differ = gate.differences(best.get("environment") or {}, environment(ctx.world_size))
    if differ:
        raise RecipeError("the recorded result is not comparable here: "
                          + "; ".join(wording.difference(d, ("recorded", "here")) for d in differ)
                          + ". Record a baseline on this machine (run the search here) and check against that")
    answer, baseline, recorded = record_of(best, recipe, Machine.detect(), absolute)
    return check_rounds(recipe, ctx, answer, baseline, recorded, tolerance, rounds, absolute, process_noise)


@_as_found
def check_rev(
    recipe_path: str | os.PathLike[str],
    rev: str,
    tolerance: float = gate.DEFAULT_TOLERANCE,
    rounds: int = gate.DEFAULT_REV_ROUNDS,
    overrides: tuple[str, ...] = (),
    nproc_per_node: int = 1,
    progress: Any = None,
) -> gate.RevResult:
    """Gate the working tree against git revision ``rev``: the recipe's task (or script) as
    checked out at ``rev`` (a worktree) and as it is now, each measurement a fresh process,
    interleaved, read as pairs (:func:`tuner.analysis.gate.rev_verdict`). Exit 1 when the
    working tree is shown slower beyond ``tolerance``, 0 when shown within, 4 when undecided.

    Args:
        rounds: the most rounds (each side once); it stops as soon as the rule settles.
        nproc_per_node: ranks a task recipe's measurements run on (torchrun); a script
            recipe launches its own.
        progress: called with (round, rev's samples/s, the working tree's) after each round.
    """
    from tuner.tuning.gate_rounds import gate_revision

    if not 0 <= tolerance < 1:
        raise RecipeError(f"--tolerance must be in [0, 1), got {tolerance}")
    if rounds < 2:
        raise RecipeError(f"--rounds must be >= 2 for --rev (pairs need two rounds), got {rounds}")
    if distributed.context().world_size > 1:
        raise RecipeError("tuner check --rev runs in one process and launches each side itself: run it without "
                          "torchrun and give --nproc-per-node N")
    recipe = load_recipe(recipe_path, overrides, world_size=nproc_per_node)
    return gate_revision(recipe, rev, tolerance, rounds, overrides, nproc_per_node, progress)


def _load(recipe: Recipe | str | os.PathLike[str], overrides: Sequence[str], world_size: int,
          knobs: dict[str, Any]) -> Recipe:
    """A recipe path loaded with ``overrides``, or a loaded recipe; ``knobs`` fixed on it."""
    if isinstance(recipe, Recipe):
        return dataclasses.replace(recipe, knob_overrides={**recipe.knob_overrides, **parse_knobs(knobs, "knobs")})
    return load_recipe(recipe, overrides, world_size=world_size, knobs=knobs)
