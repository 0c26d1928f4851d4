"""The performance regression gate users put in CI (``python -m tuner.check``): the verdict.

Pure functions of results: whether two environments can be compared at all, and the
median of the measured repeats against the recorded throughput. Measuring the recorded
configuration is the caller's (:func:`tuner.api.check`). A refusal is bad input (exit 2);
a regression is exit 1.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

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


DECIDING = (("device", "device"), ("world_size", "world size"), ("device_count", "device count"))
"""Environment fields whose difference voids a throughput comparison: (key, what it is)."""


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any], labels: tuple[str, str] = ("recorded", "here"),
                keys: Sequence[tuple[str, str]] = DECIDING) -> list[str]:
    """What differs between two environment records in a way that voids a comparison
    (``labels``: what to call each side; ``keys``: the fields compared)."""
    out = []
    for key, what in keys:
        if key in recorded and recorded.get(key) != current.get(key):
            out.append(f"{what}: {labels[0]} {recorded.get(key)!r}, {labels[1]} {current.get(key)!r}")
    return out


def verdict(recorded: float, rates: list[float], runs: int, tolerance: float, params: dict[str, Any],
            state: str, reason: str | None) -> CheckResult:
    """Compare the median of ``rates`` (the repeats that ran, of ``runs``) with ``recorded``.

    Args:
        state, reason: the measurement's (the first failed repeat's, if any failed).
    """
    if not rates:
        return CheckResult(recorded, None, [], tolerance, False,
                           f"the configuration no longer runs: {state}: {reason}", params, [])
    measured = statistics.median(rates)
    floor = recorded * (1 - tolerance)
    failures = runs - len(rates)
    passed = measured >= floor and failures == 0
    if failures:
        why = f"{failures} of {runs} repeats failed ({reason})"
    elif passed:
        why = f"within tolerance: {measured:,.1f} >= {floor:,.1f} samples/s"
    else:
        why = (f"regression: {measured:,.1f} < {floor:,.1f} samples/s "
               f"({tolerance:.0%} below the recorded {recorded:,.1f})")
    return CheckResult(recorded, measured, [min(rates), max(rates)], tolerance, passed, why, params, rates)
