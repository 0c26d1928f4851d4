"""The regression gate's measurements, interleaved (ABBA: A, B, then B, A, ...) until the one
rule settles the gate or the rounds run out (:mod:`tuner.analysis.gate` judges): the recorded
answer and its baseline in this one run (``--against``), or the recipe at a git revision and
at the working tree, each run a process of its own (``--rev``, :func:`rev_rounds`).

Interleaved, both configurations see the same minutes of the machine: what the machine
does meanwhile (another job, a slower hour) moves both and leaves their ratio alone, where
an absolute rate carries it whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tuner.analysis.gate import CheckResult, Recorded, RevResult, log_ratios, rev_verdict, settled, verdict
from tuner.harness import distributed
from tuner.inputs.errors import RecipeError
from tuner.inputs.plan import Plan
from tuner.runner import runner_for
from tuner.stats import decision
from tuner.stats.interval import paired

if TYPE_CHECKING:
    from tuner.harness.distributed import DistContext
    from tuner.inputs.recipe import Recipe
    from tuner.inputs.space import Machine


def check_rounds(recipe: "Recipe", ctx: "DistContext", answer: Plan, baseline: Plan, recorded: Recorded,
                 tolerance: float, rounds: int, absolute: bool = False,
                 process_noise: float | None = None) -> CheckResult:
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
                    failure = {"side": name, "state": result.state, "reason": result.reason}
                    restart = result.restart
                    break
                rates[name].append(result.metrics["samples_per_s"])
            else:
                done += 1
                if done >= look:
                    look = decision.next_look(done)
                    if distributed.broadcast(settled(recorded, rates["answer"], rates["baseline"], tolerance,
                                                     absolute, process_noise)):
                        break
    finally:
        runner.close()
    out = verdict(recorded, rates["answer"], rates["baseline"], tolerance, absolute, failure, done, process_noise)
    out.params, out.baseline_params, out.restart = answer.params(), baseline.params(), restart
    return out


Side = Callable[[str], "float | str"]
"""Measures one side (``rev`` or ``work``) once: its samples/s, or why it did not run."""


def rev_rounds(measure: Side, tolerance: float, rounds: int, commit: str = "", name: str = "",
               on_round: Callable[[int, float, float], None] | None = None) -> RevResult:
    """The revision and the working tree in ABBA rounds, read as pairs after each round,
    until the one rule decides the gate (pass or fail: :func:`tuner.stats.decision.judge`) or
    ``rounds`` rounds; the verdict (:func:`tuner.analysis.gate.rev_verdict`). This loop is also
    what ``scripts/gate_power.py`` runs on simulated rates for the published power table.

    A precise interval does not stop it, as it stops the finish: a finish may take either side
    of a precise question at less than the tolerance's cost, but a gate must say pass or fail."""
    rates: dict[str, list[float]] = {"rev": [], "work": []}
    failure = None
    for done in range(rounds):
        order = ("rev", "work") if done % 2 == 0 else ("work", "rev")
        got = {}
        for side in order:
            rate = measure(side)
            if isinstance(rate, str):
                failure = {"side": side, "reason": rate}
                break
            got[side] = rate
        if failure is not None:
            break
        for side in order:
            rates[side].append(got[side])
        if on_round is not None:
            on_round(done + 1, got["rev"], got["work"])
        gated = paired(log_ratios(rates["rev"], rates["work"]))
        if done >= 1 and decision.judge(gated, tolerance) != decision.UNDECIDED:
            break
    return rev_verdict(rates["rev"], rates["work"], tolerance, commit, name, failure)


def gate_revision(recipe: "Recipe", rev: str, tolerance: float, rounds: int, overrides: Sequence[str] = (),
                  nproc: int = 1, progress: Callable[[int, float, float], None] | None = None) -> RevResult:
    """``recipe`` at git revision ``rev`` (a worktree, removed afterwards) against the
    working tree: :func:`rev_rounds` over fresh processes of each (:mod:`tuner.runner.revision`)."""
    import tempfile

    from tuner.runner.revision import Revision, measure_once

    with tempfile.TemporaryDirectory(prefix="tuner-rev-") as scratch:
        with Revision(recipe.path, rev, Path(scratch) / "tree") as revision:
            trees = {"rev": revision.tree, "work": revision.root}
            count = {"rev": 0, "work": 0}

            def measure(side: str) -> float | str:
                count[side] += 1
                tree = trees[side]
                assert tree is not None
                out = recipe.out / "check" / f"{side}-{count[side]:03d}"
                return measure_once(tree, revision.relative, overrides, out, nproc, recipe.steps.timeout_s + 120)

            return rev_rounds(measure, tolerance, rounds, revision.commit, rev, progress)


def record_of(best: dict[str, Any], recipe: "Recipe", machine: "Machine",
              absolute: bool) -> tuple[Plan, Plan, Recorded]:
    """What ``--against`` gates: the recorded answer's and baseline's configurations and their
    recorded rates, checked against ``recipe`` (the environment is the caller's to check,
    :func:`tuner.analysis.gate.differences`); what makes the comparison meaningless is
    refused in one line."""
    if best.get("recipe") and Path(best["recipe"]).name != recipe.path.name:
        raise RecipeError(f"--against was recorded for {best['recipe']}, not {recipe.path}")
    params, base = best["params"], (best.get("baseline") or {}).get("params")
    if not base or not (best.get("baseline") or {}).get("metrics"):
        raise RecipeError("--against records no measured baseline: the gate compares the answer's speedup over it")
    try:
        ran = Plan.recorded(recipe.world_size, params)
    except (TypeError, ValueError) as exc:
        raise RecipeError(f"--against records a configuration tuner cannot read ({exc}); record it again") from None
    batch = ran.batch.micro_batch_size * ran.batch.grad_accum_steps * ran.layout.dp
    if batch != recipe.global_batch_size:
        raise RecipeError(f"the recorded configuration trains {batch} samples per step, the recipe's "
                          f"global_batch_size is {recipe.global_batch_size}: they must match")
    answer, baseline = (recipe.configs(machine)(_knobs(p)) for p in (params, base))
    if answer == baseline and not absolute:
        raise RecipeError("nothing to gate: the recorded answer is its own baseline (speedup 1.00x), so no speedup "
                          "can shrink; gate its samples/s with --absolute (on a quiet, dedicated machine)")
    runs = best.get("runs") if isinstance(best.get("runs"), dict) else {}
    noise = best.get("noise") or {}
    recorded = Recorded(_rates((runs or {}).get("best"), best["metrics"]),
                        _rates((runs or {}).get("baseline"), best["baseline"]["metrics"]),
                        (float(noise.get("ss") or 0.0), int(noise.get("dof") or 0)))
    return answer, baseline, recorded


def _knobs(params: dict[str, Any]) -> dict[str, Any]:
    """A recorded configuration's knobs (what follows from them left to follow again)."""
    return {k: v for k, v in params.items() if k not in ("grad_accum_steps", "engine")}


def _rates(runs: list[dict[str, Any]] | None, metrics: dict[str, Any]) -> list[float]:
    """samples/s of every recorded run (the median alone where a record has no runs)."""
    rates = [float(r["samples_per_s"]) for r in runs or [] if r and r.get("samples_per_s")]
    return rates or [float(metrics["samples_per_s"])]


def load_best(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """``best.json`` (or a run folder holding one), checked for what the gate needs."""
    p = Path(path)
    if p.is_dir():
        p = p / "best.json"
    try:
        best = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"--against: {p} does not exist (give a run folder or its best.json)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise RecipeError(f"--against: {p} is not a readable best.json ({exc})") from None
    if not isinstance(best, dict) or not best.get("params") or not (best.get("metrics") or {}).get("samples_per_s"):
        raise RecipeError(f"--against: {p} records no successful configuration to check against "
                          "(its search found none, or this is not a tuner best.json)")
    return best


