"""Student's t quantiles at any level: how wide an interval from ``dof`` degrees of freedom must be.

One function for every interval of the tuner (the window's length at 95%, every decision at
99%, the prune bar's and the gate's one-sided bounds). For integer degrees of freedom the
distribution function has a closed form (Abramowitz & Stegun 26.7.3 and 26.7.4: a finite sum
in ``cos(theta)``, ``theta = atan(t / sqrt(dof))``), so the quantile is that function inverted
by bisection to 1e-12, at any level. No SciPy: the package does not otherwise need it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

EXACT_UP_TO = 300
"""Beyond this many degrees of freedom the Cornish-Fisher expansion around the normal is used
(its error there is below 1e-8, and the exact sum would take ``dof / 2`` terms a step)."""


def central(t: float, dof: int) -> float:
    """``P(|T| < t)`` for Student's t with ``dof`` (integer >= 1) degrees of freedom."""
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if dof % 2 == 1:  # A&S 26.7.3: (2/pi)(theta + sin cos (1 + 2/3 cos^2 + 2.4/3.5 cos^4 + ...))
        total, term = 1.0, 1.0
        for k in range(1, (dof - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        series = s * math.cos(theta) * total if dof > 1 else 0.0
        return min(1.0, 2 / math.pi * (theta + series))
    total, term = 1.0, 1.0  # A&S 26.7.4: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...)
    for k in range(1, dof // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return min(1.0, s * total)


@lru_cache(maxsize=4096)
def t_quantile(dof: int, level: float = 0.99) -> float:
    """The two-sided ``level`` quantile of Student's t with ``dof`` degrees of freedom: the
    ``t`` with ``P(|T| < t) = level`` (a one-sided bound at ``q`` is ``t_quantile(dof, 2q - 1)``).

    Args:
        dof: degrees of freedom, an integer >= 1.
        level: in (0, 1).
    """
    if dof < 1:
        raise ValueError(f"t quantile needs >= 1 degree of freedom, got {dof}")
    if not 0 < level < 1:
        raise ValueError(f"t quantile needs a level in (0, 1), got {level}")
    dof = int(dof)
    if dof > EXACT_UP_TO:
        z = NormalDist().inv_cdf((1 + level) / 2)
        return (z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
                + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3))
    lo, hi = 0.0, 1.0
    while central(hi, dof) < level:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if central(mid, dof) < level:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def one_sided(dof: int, confidence: float) -> float:
    """The one-sided ``confidence`` bound's quantile (``P(T < t) = confidence``, above 1/2)."""
    return t_quantile(dof, 2 * confidence - 1)
