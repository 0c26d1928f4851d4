"""``tuner.measure``: the harness on one configuration, from Python.

Each repeat is a whole trial (build, warm-up, measure, teardown) in this process, so the
spread between repeats includes what changes from one build to the next. The reported
metrics are the median over the repeats that succeeded; failures are counted, never
dropped.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Sequence

from tuner import distributed, engines
from tuner.diagnose import Verdict, diagnose_run
from tuner.environment import environment
from tuner.metrics import METRIC_NAMES
from tuner.errors import RecipeError
from tuner.recipe import Recipe, load_recipe
from tuner.space import Config, Machine, make_config, parse_knobs
from tuner.trial import OK, Instruments, TrialResult, run_trial


@dataclass
class Measurement:
    """One configuration measured ``len(repeats)`` times."""

    recipe: str
    params: dict[str, Any]
    state: str
    """``ok`` when every repeat succeeded, else the first failure's state."""
    reason: str | None
    metrics: dict[str, Any] | None
    """Median over successful repeats, DESIGN.md names; ``None`` if none succeeded."""
    spread: dict[str, list[float]]
    """``[min, max]`` over successful repeats, per metric."""
    repeats: list[TrialResult]
    environment: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    """Knobs that could not apply on this machine, and what was used instead."""
    diagnosis: list[Verdict] = field(default_factory=list)
    """Why it runs at this speed, the headline first (:mod:`tuner.diagnose`)."""

    @property
    def failures(self) -> int:
        return sum(not r.ok for r in self.repeats)

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "params": self.params,
            "state": self.state,
            "reason": self.reason,
            "metrics": self.metrics,
            "spread": self.spread,
            "failures": self.failures,
            "repeats": [dataclasses.asdict(r) for r in self.repeats],
            "environment": self.environment,
            "notes": self.notes,
            "diagnosis": [v.to_json() for v in self.diagnosis],
        }


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
        recipe: a recipe path or a loaded :class:`~tuner.recipe.Recipe`.
        repeats: trials to run; default the recipe's ``steps.repeats``.
        overrides: ``key=value`` recipe overrides (paths only), as ``--set``.
        trace: a folder for a ``torch.profiler`` trace of the first repeat's measured
            window (``trace_rank<N>.json``, one per rank).
        nvtx: NVTX ranges around the phases of each step (CUDA builds).
        **knobs: knob values (``num_workers=4, amp_dtype="bf16"``); they win over the
            recipe's fixed space values and its baseline.
    """
    ctx = distributed.context()
    if isinstance(recipe, Recipe):
        fixed = parse_knobs(knobs, "knobs")
        recipe = dataclasses.replace(recipe, knob_overrides={**recipe.knob_overrides, **fixed})
    else:
        recipe = load_recipe(recipe, overrides, world_size=ctx.world_size, knobs=knobs)
    config, notes = measured_config(recipe, Machine.detect())
    n = repeats if repeats is not None else recipe.steps.repeats
    if n < 1:
        raise ValueError(f"repeats must be >= 1, got {n}")
    if recipe.script is not None:
        if ctx.world_size > 1:
            raise RecipeError(f"script: measure a script recipe from one process (python -m tuner.measure "
                              f"{recipe.path}); each trial launches torchrun with nproc_per_node itself")
        from tuner.launcher import ScriptTrials

        scripts = ScriptTrials(recipe, recipe.out / "measure")
        runs = [scripts.run(config) for _ in range(n)]
        return _combine(recipe, config, runs, notes, recipe.world_size)
    engines.prepare(config, ctx.device)
    first = Instruments(trace_dir=Path(trace) if trace is not None else None, nvtx=nvtx)
    rest = Instruments(nvtx=nvtx)
    runs = [run_trial(recipe, config, ctx, instruments=first if i == 0 else rest) for i in range(n)]
    return _combine(recipe, config, runs, notes, ctx.world_size)


def measured_config(recipe: Recipe, machine: Machine) -> tuple[Config, list[str]]:
    """The configuration ``measure`` runs: defaults <- fixed space values <- baseline <- ``--set``."""
    knobs = {name: values[0] for name, values in recipe.space.items() if len(values) == 1}
    knobs.update(recipe.baseline)
    knobs.update(recipe.knob_overrides)
    return make_config(knobs, recipe.global_batch_size, recipe.world_size, machine, recipe.engine)


def _combine(recipe: Recipe, config: Config, runs: list[TrialResult], notes: list[str], world: int) -> Measurement:
    good = [r.metrics for r in runs if r.ok and r.metrics is not None]
    first_bad = next((r for r in runs if not r.ok), None)
    metrics: dict[str, Any] | None = None
    spread: dict[str, list[float]] = {}
    if good:
        metrics = {}
        for name in METRIC_NAMES:
            values = [m[name] for m in good if m.get(name) is not None]
            metrics[name] = statistics.median(values) if values else None
            if values:
                spread[name] = [min(values), max(values)]
    env = environment(world)
    return Measurement(
        recipe=recipe.name,
        params=config.params(),
        state=OK if first_bad is None else first_bad.state,
        reason=None if first_bad is None else first_bad.reason,
        metrics=metrics,
        spread=spread,
        repeats=runs,
        environment=env,
        notes=notes,
        diagnosis=diagnose_run(metrics, config.params(), recipe.budget.memory_gib, env),
    )

