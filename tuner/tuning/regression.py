"""The regression gate's measurements: the recorded answer and the recorded baseline,
interleaved (ABBA: answer, baseline, then baseline, answer, ...) in this one run, until the
one rule settles the gate or the rounds run out (:mod:`tuner.analysis.gate` judges).

Interleaved, both configurations see the same minutes of the machine: what the machine
does meanwhile (another job, a slower hour) moves both and leaves their ratio alone, where
an absolute rate carries it whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.analysis.gate import CheckResult, Recorded, settled, verdict
from tuner.harness import distributed
from tuner.runner import runner_for
from tuner.stats import decision

if TYPE_CHECKING:
    from tuner.config.recipe import Recipe
    from tuner.config.space import Config
    from tuner.harness.distributed import DistContext


def check_rounds(recipe: "Recipe", ctx: "DistContext", answer: "Config", baseline: "Config", recorded: Recorded,
                 tolerance: float, rounds: int, absolute: bool = False) -> CheckResult:
    """Measure ``answer`` and ``baseline`` in interleaved rounds until the gate is settled
    (looked at on :data:`tuner.stats.decision.LOOKS`) or ``rounds`` rounds; the verdict."""
    runner = runner_for(recipe, ctx, recipe.out / "check", command="check")
    rates: dict[str, list[float]] = {"answer": [], "baseline": []}
    failure, restart, done, look = None, None, 0, 1
    try:
        while done < rounds and failure is None:
            order = [("answer", answer), ("baseline", baseline)]
            for name, config in order if done % 2 == 0 else order[::-1]:
                result = runner.run(config)
                if not result.ok or not result.metrics:
                    failure, restart = f"{name}: {result.state}: {result.reason}", result.restart
                    break
                rates[name].append(result.metrics["samples_per_s"])
            else:
                done += 1
                if done >= look:
                    look = decision.next_look(done)
                    if distributed.broadcast(settled(recorded, rates["answer"], rates["baseline"], tolerance,
                                                     absolute)):
                        break
    finally:
        runner.close()
    out = verdict(recorded, rates["answer"], rates["baseline"], tolerance, absolute, failure, done)
    out.params, out.baseline_params, out.restart = answer.params(), baseline.params(), restart
    return out
