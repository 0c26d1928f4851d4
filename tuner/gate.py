"""The performance regression gate users put in CI (``python -m tuner.check``).

Measures the configuration a search recorded in ``best.json``, with repeats, and compares
the median throughput against the recorded one. Refuses, rather than answering, when the
comparison would mean nothing: another device, another world size, another recipe or
global batch. A refusal is bad input (exit 2); a regression is exit 1.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner import distributed
from tuner.errors import RecipeError

DEFAULT_REPEATS = 3


@dataclass
class CheckResult:
    """The recorded throughput, the measured one, and the verdict."""

    recorded: float
    measured: float | None
    """Median samples/s over the repeats that succeeded (``None``: none did)."""
    spread: list[float]
    """``[min, max]`` of the repeats' samples/s."""
    tolerance: float
    passed: bool
    reason: str
    params: dict[str, Any] = field(default_factory=dict)
    repeats: list[float] = field(default_factory=list)

    @property
    def change(self) -> float | None:
        """Measured / recorded - 1 (negative: slower)."""
        return self.measured / self.recorded - 1 if self.measured is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "recorded_samples_per_s": self.recorded,
                "measured_samples_per_s": self.measured, "spread": self.spread, "change": self.change,
                "tolerance": self.tolerance, "repeats": self.repeats, "params": self.params}


def load_best(path: str | os.PathLike[str]) -> dict[str, Any]:
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


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between two environment records in a way that voids a comparison."""
    out = []
    for key, what in (("device", "device"), ("world_size", "world size"), ("device_count", "device count")):
        if key in recorded and recorded.get(key) != current.get(key):
            out.append(f"{what}: recorded {recorded.get(key)!r}, here {current.get(key)!r}")
    return out


def check(
    recipe_path: str | os.PathLike[str],
    against: str | os.PathLike[str],
    tolerance: float = 0.05,
    repeats: int = DEFAULT_REPEATS,
    overrides: tuple[str, ...] = (),
) -> CheckResult:
    """Measure ``against``'s configuration of the recipe and compare (rank 0's result is
    the one to read under torchrun)."""
    from tuner.api import measure
    from tuner.environment import environment
    from tuner.recipe import load_recipe

    if not 0 <= tolerance < 1:
        raise RecipeError(f"--tolerance must be in [0, 1), got {tolerance}")
    if repeats < 1:
        raise RecipeError(f"--repeats must be >= 1, got {repeats}")
    best = load_best(against)
    ctx = distributed.context()
    recipe = load_recipe(recipe_path, overrides, world_size=ctx.world_size)
    differ = differences(best.get("environment") or {}, environment(ctx.world_size))
    if differ:
        raise RecipeError("the recorded result is not comparable here: " + "; ".join(differ)
                          + ". Record a baseline on this machine (run the search here) and check against that")
    params = best["params"]
    if best.get("recipe") and Path(best["recipe"]).name != recipe.path.name:
        raise RecipeError(f"--against was recorded for {best['recipe']}, not {recipe.path}")
    batch = params.get("micro_batch_size", 0) * params.get("grad_accum_steps", 0) * ctx.world_size
    if batch != recipe.global_batch_size:
        raise RecipeError(f"the recorded configuration trains {batch} samples per step, the recipe's "
                          f"global_batch_size is {recipe.global_batch_size}: they must match")
    knobs = {k: v for k, v in params.items() if k not in ("grad_accum_steps", "engine")}
    m = measure(recipe, repeats=repeats, **knobs)
    rates = [r.metrics["samples_per_s"] for r in m.repeats if r.ok and r.metrics]
    recorded = float(best["metrics"]["samples_per_s"])
    if not rates:
        return CheckResult(recorded, None, [], tolerance, False,
                           f"the configuration no longer runs: {m.state}: {m.reason}", params, [])
    measured = statistics.median(rates)
    floor = recorded * (1 - tolerance)
    failures = len(m.repeats) - len(rates)
    passed = measured >= floor and failures == 0
    if failures:
        reason = f"{failures} of {len(m.repeats)} repeats failed ({m.reason})"
    elif passed:
        reason = f"within tolerance: {measured:,.1f} >= {floor:,.1f} samples/s"
    else:
        reason = f"regression: {measured:,.1f} < {floor:,.1f} samples/s ({tolerance:.0%} below the recorded {recorded:,.1f})"
    return CheckResult(recorded, measured, [min(rates), max(rates)], tolerance, passed, reason, params, rates)
