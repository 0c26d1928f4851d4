"""Student's t quantiles: how wide an interval from ``dof`` degrees of freedom must be.

Two levels, each from a printed table to 30 degrees of freedom and the Cornish-Fisher
expansion around the normal beyond (within 0.001 of the exact value): 95% for how long a
window measures (:mod:`tuner.harness.window_length`), 99% for every decision of the search
(:mod:`tuner.analysis.interval`).
"""

from __future__ import annotations

_TABLES = {
    0.95: (1.959963984540054,
           (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
            2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)),
    0.99: (2.5758293035489,
           (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169, 3.106, 3.055, 3.012, 2.977, 2.947,
            2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763, 2.756, 2.750)),
}
"""Two-sided level -> (the normal's quantile, t quantiles for 1..30 degrees of freedom)."""


def t_quantile(dof: int, level: float = 0.99) -> float:
    """The two-sided ``level`` quantile of Student's t with ``dof`` degrees of freedom
    (``level`` 0.95 or 0.99)."""
    if dof < 1:
        raise ValueError(f"t quantile needs >= 1 degree of freedom, got {dof}")
    z, table = _TABLES[level]
    if dof <= len(table):
        return table[dof - 1]
    return (z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3))
