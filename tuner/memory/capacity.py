"""What fits, before a search: ``tuner plan``. The largest micro-batch predicted to fit the
memory budget for each sharding x AMP x checkpointing combination of the recipe's space.

The prediction is the search's own memory model (:mod:`tuner.memory.model`): model states
from the parameter count (analytic, exact per engine and sharding), plus what a few short
profiled trials measure: the baseline's group (AMP dtype x checkpointing) at its smallest
micro-batch and at one at least four times larger (the intercept and the activations per
sample), then each other group at one micro-batch (its own activations per sample). Each
profiled trial is predicted before it runs, so the plan's error bound is the model's worst
error on what it had not seen (the same ``error so far`` the search's skipping trusts).
A profiled trial that runs out of memory or breaks the budget caps its group below it.

The profile runs ``PROFILE_STEPS`` (one warm-up, two measured steps): peak memory is set
by the first forward, backward and optimizer step, not by the window's length.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.harness import distributed
from tuner.harness.metrics import budget_peak
from tuner.inputs import levers
from tuner.inputs.errors import RecipeError
from tuner.inputs.layout import Layout
from tuner.inputs.plan import Plan
from tuner.inputs.recipe import Steps
from tuner.inputs.rules import conflict
from tuner.inputs.space import Machine
from tuner.memory import model as memory
from tuner.runner import InProcess
from tuner.study import searchspace

if TYPE_CHECKING:
    import torch

    from tuner.harness.distributed import DistContext
    from tuner.inputs.recipe import Recipe
    from tuner.trial.trial_result import TrialResult

PROFILE_STEPS = Steps(warmup=1, measure=2, repeats=1)
SHARDING = levers.with_memory("states")
"""The levers that move the model states (analytic in the memory model)."""
SECOND_PROFILE_RATIO = 4
"""The baseline group's second profiled micro-batch is at least this many times its first
(or the largest there is): two close micro-batches pin the slope poorly."""


@dataclass(frozen=True)
class Row:
    """One combination: the largest micro-batch predicted to fit, and the next size up."""

    knobs: dict[str, Any]
    """Sharding, AMP dtype and checkpointing (the baseline's value of every other knob)."""
    layout: Layout
    """How these knobs place the model on the ranks."""
    micro_batch_size: int | None
    """``None``: not even the smallest micro-batch is predicted to fit."""
    predicted_gib: float | None
    next_micro_batch_size: int | None
    next_predicted_gib: float | None
    measured: str | None = None
    """What the profile measured in this row, when it ran one (``16: 0.55, 64: 0.62``, in GiB)."""


@dataclass
class CapacityPlan:
    recipe: str
    budget_gib: float
    budget_source: str
    bound: float | None
    """The model's worst relative error on the profiled trials it predicted from a fit (a new
    group's from its prior too)."""
    rows: list[Row]
    profiled: list[dict[str, Any]] = field(default_factory=list)
    """Each profiled trial: knobs, predicted and measured peak (GiB), state."""
    parameters: int = 0
    world_size: int = 1
    wall_s: float = 0.0
    restart: str | None = None
    """Why profiling stopped early: a trial left the process unable to run another."""
    largest_batch: str | None = None
    """What the scan for the batch of the largest samples read: each profiled peak is taken
    there where batches differ (:mod:`tuner.trial.largest_batch`)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Profiler:
    """Rank 0's side: which trial to profile next, and what the profile showed."""

    def __init__(self, recipe: "Recipe", machine: Machine, budget: tuple[float, str] | None = None) -> None:
        self.recipe, self.machine = recipe, machine
        self.space = searchspace.build_space(recipe, machine)
        self.base = searchspace.baseline_knobs(recipe, self.space, machine)
        model, why = memory.model_for(recipe.task, recipe.task_args, recipe.world_size, not machine.cuda, [])
        if model is None:
            raise RecipeError(why or f"plan: {recipe.path} needs a task recipe")  # tuner.api.plan says why first
        self.model = model
        self.budget_gib, self.budget_source = budget or plan_budget(recipe, machine, None)
        self.profiled: list[dict[str, Any]] = []
        self.capped: dict[tuple[Any, ...], int] = {}
        """The smallest micro-batch per group that did not fit when profiled."""
        self._queue = self._groups()

    def plans(self, knobs: dict[str, Any]) -> list[Plan]:
        """The configuration with ``knobs`` at each of the space's micro-batch sizes that makes
        one, smallest first."""
        sizes = sorted(set(self.space.choices["micro_batch_size"]))
        made = (self.config({**knobs, "micro_batch_size": m}) for m in sizes)
        return [p for p in made if p is not None]

    def config(self, knobs: dict[str, Any]) -> Plan | None:
        r = self.recipe
        if conflict(knobs) is not None:
            return None
        try:
            config = self.space.make({**self.base, **knobs})
        except RecipeError:
            return None
        return None if self.space.refusal(config, r.global_batch_size) else config

    def _groups(self) -> list[dict[str, Any]]:
        """The baseline's group first, then every other activation group of the space (AMP x
        checkpointing x the layout's schedule and sequence sharding), each as a configuration
        at the baseline's other knobs holds it: a group whose lever means nothing there (a
        pipeline schedule without stages) is the group it collapses to, so the profile never
        asks for one group twice."""
        c, names = self.space.choices, memory.GROUP
        out: list[dict[str, Any]] = []
        for values in [tuple(self.base[k] for k in names), *itertools.product(*(c[k] for k in names))]:
            config = self.config({**dict(zip(names, values)), "micro_batch_size": self.base["micro_batch_size"]})
            group = {k: getattr(config, k) for k in names} if config is not None else dict(zip(names, values))
            if group not in out:
                out.append(group)
        self.base_group = out[0]
        return out

    def next(self) -> Plan | None:
        """The plan of the next profiled trial (made here, on rank 0, and broadcast); ``None``
        when the profile is complete."""
        while self._queue:
            group = self._queue[0]
            plans = [p for p in self.plans(group) if p.batch.micro_batch_size < self.capped.get(_key(group), 1 << 62)]
            seen = [p["knobs"]["micro_batch_size"] for p in self.profiled if _key(p["knobs"]) == _key(group)]
            pick = self._pick(group, plans, seen)
            if pick is None:
                self._queue.pop(0)
                continue
            return next(p for p in plans if p.batch.micro_batch_size == pick)
        return None

    def _pick(self, group: dict[str, Any], plans: list[Plan], seen: list[int]) -> int | None:
        """The baseline's group: its smallest micro-batch, then one four times larger, then the
        largest predicted to fit (a check of the fit); every other group: the largest
        predicted to fit (its own slope, measured where it matters most)."""
        micros = [p.batch.micro_batch_size for p in plans]
        if not micros:
            return None
        if group == self.base_group:
            if not seen:
                return micros[0]
            if len(seen) == 1:
                larger = [m for m in micros if m > seen[0]]
                far = [m for m in larger if m >= SECOND_PROFILE_RATIO * seen[0]]
                return (far or larger or [None])[0]
            if len(seen) > 2:
                return None
        elif seen:
            return None
        fits = memory.largest_fitting(self.model, plans, self.budget_gib)
        pick = fits[0] if fits[0] is not None else micros[0]
        return None if pick in seen else pick

    def observe(self, plan: Plan, result: "TrialResult") -> None:
        predicted = self.model.predict(plan)
        peak = budget_peak(result.metrics or {}) if result.ok else None
        over = peak is not None and peak > self.budget_gib
        entry = {"knobs": plan.params(),
                 "predicted_gib": predicted.peak_gib, "basis": predicted.basis, "measured_gib": peak,
                 "state": result.state if not over else "over_budget"}
        self.profiled.append(entry)
        if peak:
            self.model.observe(plan, predicted.peak_gib, peak, predicted.basis)
        if peak is None or over:  # it did not fit: nothing this size or larger in its group
            key = _key(entry["knobs"])
            self.capped[key] = min(self.capped.get(key, 1 << 62), plan.batch.micro_batch_size)

    def plan(self, wall_s: float) -> CapacityPlan:
        """Every sharding x AMP x checkpointing combination of the space, and what fits it."""
        c = self.space.choices
        rows = []
        for values in itertools.product(*(c[k] for k in (*SHARDING, *memory.GROUP))):
            knobs = dict(zip((*SHARDING, *memory.GROUP), values))
            plans = self.plans(knobs)
            if not plans:
                continue
            config = plans[0]
            knobs = {k: getattr(config, k) for k in (*SHARDING, *memory.GROUP)}  # normalised: what really differs
            if all(r.knobs != knobs for r in rows):
                rows.append(self._row(knobs))
        checked = [abs(p["predicted_gib"] - p["measured_gib"]) / p["measured_gib"] for p in self.profiled
                   if p["measured_gib"] and p["basis"] != "analytic"]  # a group's prior counts: conservative
        bound = max(checked) if checked else None
        return CapacityPlan(str(self.recipe.path), self.budget_gib, self.budget_source, bound, rows, self.profiled,
                            self.model.parameters, self.recipe.world_size, wall_s)

    def _row(self, knobs: dict[str, Any]) -> Row:
        cap = self.capped.get(_key(knobs))
        plans = self.plans(knobs)
        fit, predicted = memory.largest_fitting(
            self.model, [p for p in plans if cap is None or p.batch.micro_batch_size < cap], self.budget_gib)
        nxt = next((p for p in plans if fit is None or p.batch.micro_batch_size > fit), None)
        nxt_gib = self.model.predict(nxt).peak_gib if nxt is not None else None
        measured = [p for p in self.profiled if {k: p["knobs"][k] for k in knobs} == knobs]
        said = ", ".join(f"{p['knobs']['micro_batch_size']}: " + (f"{p['measured_gib']:.2f}" if p["measured_gib"]
                                                                   else p["state"]) for p in measured)
        return Row(knobs, plans[0].layout, fit, predicted, nxt.batch.micro_batch_size if nxt is not None else None,
                   nxt_gib, said or None)


def _key(knobs: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(knobs[k] for k in memory.GROUP)


def plan_budget(recipe: "Recipe", machine: Machine, device: "torch.device | None") -> tuple[float, str]:
    """``budget.memory_gib``, else what each rank can have of its device, and where it came
    from. On a GPU the least over the ranks (a collective: every rank calls this) of what its
    device had free when the plan started plus what its process already holds (the card's
    total would count the CUDA context and other processes' memory as room); on a CPU-only
    machine the host's memory available now, shared by the ranks."""
    if recipe.budget.memory_gib is not None:
        return recipe.budget.memory_gib, "budget.memory_gib"
    if machine.cuda and device is not None:
        from tuner.harness.system.devices import least_room

        return least_room(device) / memory.GIB, ("the least over the ranks of each GPU's free memory at start plus "
                                                 "its process's own (no budget.memory_gib)")
    import psutil

    available = psutil.virtual_memory().available / max(1, recipe.world_size)
    return available / memory.GIB, "the host's available memory per rank (no budget.memory_gib)"


def plan_recipe(recipe: "Recipe", ctx: "DistContext") -> CapacityPlan | None:
    """Profile on every rank, rank 0 deciding; rank 0 returns the plan (others ``None``)."""
    started = time.monotonic()
    machine = Machine.detect()
    short = dataclasses.replace(recipe, steps=PROFILE_STEPS)
    budget = plan_budget(recipe, machine, ctx.device)  # on every rank: the GPUs' room is a collective
    profiler = Profiler(recipe, machine, budget) if ctx.is_main else None
    restart, runner = None, InProcess(short, ctx)
    scanned = runner.largest_batch()
    while True:
        config = distributed.broadcast(profiler.next() if profiler else None)
        if config is None:
            break
        result = runner.run(config)
        if profiler:
            profiler.observe(config, result)
        if result.restart:  # agreed on every rank: the plan is made from what was profiled
            restart = result.restart
            break
    if profiler is None:
        return None
    plan = profiler.plan(time.monotonic() - started)
    plan.restart, plan.largest_batch = restart, scanned
    return plan
