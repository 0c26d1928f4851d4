"""How much slower one configuration is than another, with a 95% confidence interval.

Every decision that keeps or drops a change reads this one interval: the confirmation's
choice among finalists, the leave-one-out after the attribution, the attribution's marks.
A simpler configuration replaces a faster one only when the *upper* bound of its slowdown
is below the search's tolerance (an equivalence test); a noisy machine then widens the
interval and the fastest is kept, so noise is a reason to measure more, never to give a
measured gain back. Seen before this rule, on a known 120-configuration landscape: bf16's
15% dropped as "within ±14% a run" and the answer at 0.87x of the optimum.

The interval is Student's t on the log of the rates (gains multiply; a rate's noise is
relative): the difference of mean log-rates, its standard error from the two
configurations' own repeats pooled (``s^2 = SS / dof``, ``dof = n_a + n_b - 2``), or, while
those give fewer than :data:`MIN_DOF` degrees of freedom, from every repeated configuration
of the run pooled the same way (honest degrees of freedom, no floor). With neither, there
is no interval: nothing is decided on an assumed noise.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

LEVEL = 0.95
"""Two-sided confidence of every interval (each bound is a 97.5% one-sided bound)."""
MIN_DOF = 2
"""Degrees of freedom the pair's own repeats must give before they alone set the noise."""
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
"""Student's t 97.5% quantile for 1..30 degrees of freedom (any statistics table)."""


def t975(dof: int) -> float:
    """Student's t 97.5% quantile; past 30 degrees of freedom the Cornish-Fisher expansion
    around the normal's 1.95996 (within 0.001 of the exact value)."""
    if dof < 1:
        raise ValueError(f"t quantile needs >= 1 degree of freedom, got {dof}")
    if dof <= len(_T975):
        return _T975[dof - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def spread(groups: Iterable[Sequence[float]]) -> tuple[float, int]:
    """``(sum of squares, degrees of freedom)`` of the log-rates around each group's mean,
    pooled over the groups measured more than once."""
    ss, dof = 0.0, 0
    for rates in groups:
        logs = [math.log(r) for r in rates if r > 0]
        if len(logs) > 1:
            mean = statistics.fmean(logs)
            ss += sum((x - mean) ** 2 for x in logs)
            dof += len(logs) - 1
    return ss, dof


def relative_sd(ss: float, dof: int) -> float | None:
    """One run's relative standard deviation from a pooled :func:`spread` (None without any)."""
    return math.sqrt(ss / dof) if dof > 0 else None


@dataclass(frozen=True)
class Slowdown:
    """``1 - rate_b / rate_a``: how much slower ``b`` is than ``a`` (negative: faster)."""

    estimate: float
    low: float
    high: float
    runs: tuple[int, int]
    dof: int
    """Degrees of freedom of the noise estimate behind the interval."""

    def within(self, tolerance: float) -> bool:
        """``b`` costs less than ``tolerance`` with 95% confidence: it may replace ``a``."""
        return self.high < tolerance

    def beyond(self, tolerance: float) -> bool:
        """``b`` is slower than ``a`` by more than ``tolerance`` with 95% confidence."""
        return self.low > tolerance

    def decided(self, tolerance: float) -> bool:
        """More runs would not change the verdict against ``tolerance``."""
        return self.within(tolerance) or self.beyond(tolerance)

    def text(self) -> str:
        """``5.1% slower (95% interval 3.9% to 6.3%, 4+4 runs)``."""
        word = "slower" if self.estimate >= 0 else "faster"
        return (f"{abs(self.estimate):.1%} {word} (95% interval {self.low:+.1%} to {self.high:+.1%}, "
                f"{self.runs[0]}+{self.runs[1]} runs)")

    def gain_text(self, than: str) -> str:
        """The same interval read the other way, as what ``a`` gains over ``b``:
        ``5.1% faster than without it, 95% interval 3.9% to 6.3%``."""
        word = "faster" if self.estimate >= 0 else "slower"
        return f"{abs(self.estimate):.1%} {word} {than}, 95% interval {self.low:.1%} to {self.high:.1%}"

    def to_json(self) -> dict[str, float | int | list[int]]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "runs": list(self.runs),
                "dof": self.dof, "level": LEVEL}


def slowdown(a: Sequence[float], b: Sequence[float], run_wide: tuple[float, int] = (0.0, 0)) -> Slowdown | None:
    """How much slower ``b``'s rates are than ``a``'s, with a 95% t-interval.

    Args:
        a, b: samples/s of each run of the two configurations.
        run_wide: :func:`spread` over every configuration of the run, used while the two
            configurations' own repeats give fewer than :data:`MIN_DOF` degrees of freedom.
    """
    la, lb = [math.log(r) for r in a if r > 0], [math.log(r) for r in b if r > 0]
    if not la or not lb:
        return None
    ss, dof = spread((a, b))
    if dof < MIN_DOF and run_wide[1] > dof:
        ss, dof = run_wide
    if dof < 1:
        return None
    diff = statistics.fmean(la) - statistics.fmean(lb)  # log(rate_a / rate_b)
    half = t975(dof) * math.sqrt(ss / dof) * math.sqrt(1 / len(la) + 1 / len(lb))

    def slower(log_ratio: float) -> float:
        return 1 - math.exp(-log_ratio)

    return Slowdown(slower(diff), slower(diff - half), slower(diff + half), (len(la), len(lb)), dof)
