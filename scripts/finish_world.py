"""A simulated search whose truth is known, ended by the finish the search ships.

The operating characteristics of the tuner's decisions (docs/search.md, the promises above
every report) are measured here: a search of N trials over a small space of real levers
(loader workers, the micro-batch, ``compile`` as a loss, and ``amp_dtype`` as *the change*
whose true worth ``effect`` is set), then :func:`tuner.tuning.finish.finish` exactly as the
search calls it: its defaults, its budget (its share of the search's time, here a simulated
clock where one run takes one second), its rules. What is counted is the fate of the change:
in the answer on evidence, in it undecided, or out of it.

A run's rate is the truth times a lognormal noise of ``sigma`` a run, times the machine's
speed (a shared random walk of ``drift`` a run, on a drifting machine); with ``plateau``, the
change's configurations pay a first-use cost (their first steps 3x slower), and the rate is
what :func:`tuner.harness.metrics.summarize` makes of the window's steps.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cache
from typing import Any

from tuner.harness.metrics import Window, summarize
from tuner.inputs import levers
from tuner.inputs.space import Machine, make_config
from tuner.trial.trial_result import State, TrialResult
from tuner.tuning import finish as finish_mod
from tuner.tuning import path
from tuner.tuning.controller import ATTRIBUTE_REPEATS
from tuner.tuning.pool import Pool, key

CPU = Machine(cuda=False, bf16=True, fp16=False)
GLOBAL_BATCH = 16
TOLERANCE = 0.02
BASELINE = {"num_workers": 0, "micro_batch_size": 8, "amp_dtype": "fp32", "compile": False}
SPACE = {"num_workers": [0, 1, 2, 4], "amp_dtype": ["fp32", "bf16"], "micro_batch_size": [8, 16],
         "compile": [False, True]}
"""32 configurations; the walk changes knobs in this order."""
WORKERS = {0: 1.0, 1: 1.5, 2: 1.8, 4: 2.0}
MICRO = {8: 1.0, 16: 1.1}
COMPILE = {False: 1.0, True: 0.85}
STEPS, STEP_NOISE, PLATEAU_COST = 16, 0.02, 3.0


@dataclass(frozen=True)
class Cell:
    """One row of the table."""

    sigma: float
    """One run's noise (relative standard deviation)."""
    effect: float
    """The change's true worth: the rate with it over the rate without it, less 1."""
    trials: int = 12
    drift: float = 0.0
    """The machine's speed: a random walk of this relative step a run (0: steady)."""
    plateau: int = 0
    """First steps of a window of the change's configurations that cost 3x (0: none)."""


@cache
def _made(items: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return make_config(dict(items), GLOBAL_BATCH, 1, CPU, "auto", strict=False)[0].params()


def make(knobs: dict[str, Any]) -> dict[str, Any]:
    """The full params of ``knobs`` (cached: the finish asks often)."""
    return dict(_made(tuple(sorted((k, knobs[k]) for k in SPACE if k in knobs))))


def truth(params: dict[str, Any], effect: float) -> float:
    rate = 100.0 * WORKERS[params["num_workers"]] * MICRO[params["micro_batch_size"]]
    rate *= COMPILE[params["compile"]]
    return rate * (1 + effect) if params["amp_dtype"] == "bf16" else rate


class World:
    """The machine and the job: measures a configuration as a run would."""

    def __init__(self, cell: Cell, rng: random.Random) -> None:
        self.cell, self.rng = cell, rng
        self.clock = 0.0
        self.speed = 0.0
        """The machine's log speed (a random walk on a drifting machine)."""

    def run(self, params: dict[str, Any]) -> TrialResult:
        c = self.cell
        if c.drift:
            self.speed += self.rng.gauss(0.0, c.drift)
        rate = truth(params, c.effect) * math.exp(self.rng.gauss(0.0, c.sigma) + self.speed)
        if c.plateau and params["amp_dtype"] == "bf16":
            step = GLOBAL_BATCH / rate
            times = [step * (PLATEAU_COST if i < c.plateau else 1.0) * (1 + self.rng.gauss(0, STEP_NOISE))
                     for i in range(STEPS)]
            rate = summarize([Window(step_times=times, samples=[GLOBAL_BATCH] * STEPS, data_waits=[0.0] * STEPS,
                                     wall_s=sum(times), cpu_s=sum(times))])["samples_per_s"]
        self.clock += 1.0
        return TrialResult(dict(params), State.OK, None, {"samples_per_s": rate})

    def time(self) -> float:
        return self.clock


def neighbours(params: dict[str, Any]) -> list[dict[str, Any]]:
    """One change at a time, in :data:`SPACE`'s order."""
    out = []
    for k, values in SPACE.items():
        for v in values:
            if v != params[k]:
                out.append(make({**{n: params[n] for n in SPACE}, k: v}))
    return out


def search(world: World, pool: Pool) -> list[dict[str, Any]]:
    """The search's trials (the baseline twice, as the decider measures it, then a guided walk
    from the best so far, then random configurations), each one run; returns the finalists,
    best first by their search trial, as the decider ranks them."""
    base = make(BASELINE)
    every = [make(dict(zip(SPACE, values))) for values in _grid()]
    seen: dict[str, float] = {}

    def measure(p: dict[str, Any], source: str = "search") -> None:
        result = world.run(p)
        pool.add(result, source)
        if source == "search":
            seen[key(p)] = result.metrics["samples_per_s"]

    measure(base)
    measure(base, "repeat")
    while len(seen) < min(world.cell.trials, len(every)):
        best = max((p for p in every if key(p) in seen), key=lambda p: seen[key(p)])
        fresh = [p for p in neighbours(best) if key(p) not in seen]
        if not fresh:
            fresh = [world.rng.choice([p for p in every if key(p) not in seen])]
        measure(fresh[0])
    ranked = sorted((p for p in every if key(p) in seen), key=lambda p: -seen[key(p)])
    return ranked[:finish_mod.FINALISTS]


def _grid() -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [()]
    for values in SPACE.values():
        out = [(*t, v) for t in out for v in values]
    return out


@dataclass
class Outcome:
    fate: str
    """``kept`` (the change in the answer on evidence), ``undecided`` (in it, not shown a
    gain), ``dropped`` (not in the answer)."""
    runs: int
    """Runs the finish measured."""
    seconds: float
    search_s: float
    quality: float
    """The answer's true rate over the best configuration's."""


def simulate(cell: Cell, seed: int) -> Outcome:
    """One search and its finish, as shipped, in ``cell``'s world."""
    rng = random.Random(f"{cell}/{seed}")
    world, pool = World(cell, rng), Pool()
    finalists = search(world, pool)
    search_s = world.time()
    rules = finish_mod.Rules(TOLERANCE, make, lambda p: True, None, levers.proven)
    budget = finish_mod.Budget(finish_mod.TIME_SHARE * search_s, typical_s=1.0, clock=world.time)
    # the seconds the search holds back for its attribution's runs after the rounds
    path.hold_for(budget, ATTRIBUTE_REPEATS, pool, make(BASELINE), finalists[0], make)
    done = finish_mod.finish(finalists, make(BASELINE), world.run, pool, rules, budget)
    assert done is not None
    answer = done.answer
    best = max(truth(make(dict(zip(SPACE, v))), cell.effect) for v in _grid())
    fate = "dropped"
    if answer["amp_dtype"] == "bf16":
        s = pool.slowdown(done.reference, make({**{k: answer[k] for k in SPACE}, "amp_dtype": "fp32"}))
        fate = "kept" if s is not None and s.low > TOLERANCE else "undecided"
    return Outcome(fate, done.runs, done.seconds, search_s, truth(answer, cell.effect) / best)
