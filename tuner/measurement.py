"""One configuration measured ``repeats`` times: what ``tuner.measure`` and ``tuner.check`` run.

Each repeat is a whole trial (build, warm-up, measure, teardown) in this process, or a
script trial of its own, so the spread between repeats includes what changes from one
build to the next. The reported metrics are the median over the repeats that succeeded;
failures are counted, never dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.analysis.diagnose import Verdict, diagnose_run
from tuner.harness.metrics import METRIC_NAMES, median_of
from tuner.harness.system.environment import environment
from tuner.inputs import layout, rules
from tuner.inputs.errors import RecipeError
from tuner.inputs.plan import Plan
from tuner.inputs.space import Machine
from tuner.runner import runner_for
from tuner.trial.trial_result import Instruments, State, TrialResult

if TYPE_CHECKING:
    from tuner.harness.distributed import DistContext
    from tuner.inputs.recipe import Recipe


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
    """Why it runs at this speed, the headline first (:mod:`tuner.analysis.diagnose`)."""

    @property
    def failures(self) -> int:
        return sum(not r.ok for r in self.repeats)

    @property
    def restart(self) -> str | None:
        """Why the process that measured can run nothing more (a repeat broke it)."""
        return next((r.restart for r in self.repeats if r.restart), None)

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


def measure_recipe(recipe: "Recipe", ctx: "DistContext", repeats: int, first: Instruments = Instruments(),
                   rest: Instruments = Instruments()) -> Measurement:
    """Measure the recipe's configuration (:func:`measured_config`) ``repeats`` times."""
    config, notes = measured_config(recipe, Machine.detect())
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runner = runner_for(recipe, ctx, recipe.out / "measure", command="measure")
    runs: list[TrialResult] = []
    try:
        notes += [line] if (line := runner.largest_batch()) else []
        for i in range(repeats):
            runs.append(runner.run(config, instruments=first if i == 0 else rest))
            if runs[-1].restart:  # nothing more can run in this process
                notes.append(f"{runs[-1].restart}: {len(runs)} of {repeats} repeats ran")
                break
    finally:
        runner.close()
    world = recipe.world_size if not runner.in_process else ctx.world_size
    return combine(recipe.name, recipe.budget.memory_gib, config, runs, notes, world)


def measured_config(recipe: "Recipe", machine: Machine) -> tuple[Plan, list[str]]:
    """The configuration ``measure`` runs: defaults <- fixed space values <- baseline <- ``--set``."""
    knobs = {name: values[0] for name, values in recipe.space.items() if len(values) == 1}
    knobs.update(recipe.baseline)
    knobs.update(recipe.knob_overrides)
    config, notes = recipe.configs(machine).make(knobs)
    refused = rules.refusal(config, rules.Where(machine, layout.ranks_per_node(recipe.world_size)))
    if refused is not None:
        raise RecipeError(refused)
    return config, notes


def combine(name: str, memory_budget_gib: float | None, config: Plan, runs: list[TrialResult], notes: list[str],
            world: int) -> Measurement:
    """The repeats of recipe ``name`` as one measurement: medians, spreads, the first
    failure, the verdicts (against the memory budget)."""
    good = [r.metrics for r in runs if r.ok and r.metrics is not None]
    first_bad = next((r for r in runs if not r.ok), None)
    metrics: dict[str, Any] | None = None
    spread: dict[str, list[float]] = {}
    if good:
        metrics = {}
        for metric in METRIC_NAMES:
            values = [m[metric] for m in good if m.get(metric) is not None]
            metrics[metric] = median_of(values) if values else None
            if values and metric != "stall_free_method":
                spread[metric] = [min(values), max(values)]
    env, params = environment(world), config.params()
    return Measurement(
        recipe=name,
        params=params,
        state=State.OK.value if first_bad is None else first_bad.state,
        reason=None if first_bad is None else first_bad.reason,
        metrics=metrics,
        spread=spread,
        repeats=runs,
        environment=env,
        notes=notes,
        diagnosis=diagnose_run(metrics, {**params, **TrialResult.ran_of(runs)},
                               memory_budget_gib, env),
    )
