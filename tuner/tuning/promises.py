"""What the decisions promise, in words, read off the measured table
(:mod:`tuner.tuning.characteristics_table`, written by ``scripts/operating_characteristics.py``
from the finish as it ships): the line above every report, and what the table says at a
run's own noise. Nothing here is a bound the code was tuned to: the words are the table's."""

from __future__ import annotations

from typing import Mapping

from tuner.stats.interval import relative_sd
from tuner.tuning import characteristics_table as measured

DECISIVE = 0.05
"""The smallest true effect the promise speaks of (above twice the 2% tolerance)."""


TYPICAL_TRIALS = 12
"""The search length the headline promise speaks of (the quick start's budget)."""


def rates(sigma: float, trials: int | None = None) -> tuple[float, float]:
    """(the most often a real gain of :data:`DECISIVE` or more is dropped, the most often a
    real loss of it or more is kept) on a steady machine at ``sigma`` noise a run, over the
    searches of ``trials`` trials or more (``None``: of every length)."""
    rows = [(e, r) for (s, e, n, drift, plateau), r in measured.FINISH.items()
            if s == sigma and not drift and not plateau and (trials is None or n >= trials)]
    gains = [r["dropped"] for e, r in rows if e >= DECISIVE]
    losses = [r["kept"] + r["undecided"] for e, r in rows if e <= -DECISIVE]
    return max(gains), max(losses)


def sigmas() -> list[float]:
    return sorted({key[0] for key in measured.FINISH})


def lengths() -> list[int]:
    return sorted({key[2] for key in measured.FINISH})


def promise() -> str:
    """The line above every report: the rule, and its error rates at each noise."""
    noises = sigmas()
    table = [rates(s, TYPICAL_TRIALS) for s in noises]
    at = "/".join(f"{s:.0%}" for s in noises)
    return ("Every keep, drop and stop of this search reads one rule: a change is dropped only when its 99% "
            "interval shows that the answer without it costs less than the tolerance, kept when it shows more, "
            "and otherwise measured again, interleaved and paired, until it does or the finish's budget, where it "
            f"stays, marked undecided. Measured on the finish as it ships ({measured.FINISHES:,} simulated searches "
            f"a row, docs/search.md): after a search of {TYPICAL_TRIALS} or more trials, a real gain of "
            f"{DECISIVE:.0%} or more is dropped at most {'/'.join(f'{g:.0%}' for g, _ in table)} of the time at "
            f"{at} noise a run, and a real loss of {DECISIVE:.0%} or more kept at most "
            f"{'/'.join(f'{k:.0%}' for _, k in table)}.")


def at_noise(noise: Mapping[str, float] | None, trials: int | None = None) -> str | None:
    """What the table says at a run's noise (``{"ss", "dof"}``: its pooled log-rate spread)
    after a search of ``trials`` trials (the table's longest search not longer than it), or
    ``None`` when the run measured no noise."""
    sigma = _sigma(noise)
    if sigma is None:
        return None
    noises = sigmas()
    row = next((s for s in noises if s >= sigma), noises[-1])
    length = max([n for n in lengths() if trials is not None and n <= trials] or [lengths()[0]])
    gain, loss = rates(row, length)
    above = sigma > noises[-1]
    dof = int(noise["dof"])
    return (f"This run's noise: {sigma:.1%} a run ({dof} degree{'s' if dof != 1 else ''} of freedom); at "
            f"{'more than ' if above else ''}{row:.0%} after a search of {length} or more trials the table drops "
            f"a real {DECISIVE:.0%} gain up to {gain:.0%} of the time and keeps a real {DECISIVE:.0%} loss up to "
            f"{loss:.0%}" + (" (noisier than any row: read these as lower bounds)" if above else "") + ".")


def too_noisy(noise: Mapping[str, float] | None) -> str | None:
    """The console's warning where a run's noise is above the table's noisiest row (``None``
    below it, or where no noise was measured): its keeps and drops are then near coin flips,
    and the console says so as report.md does."""
    sigma = _sigma(noise)
    if sigma is None or sigma <= sigmas()[-1]:
        return None
    return (f"warning: this run's noise was {sigma:.0%} a run, above the {sigmas()[-1]:.0%} of the published "
            "table's noisiest row: its keeps and drops are close to coin flips; measure again on a quieter machine "
            "(report.md has the table at its noise)")


def _sigma(noise: Mapping[str, float] | None) -> float | None:
    """One run's noise from a run's ``{"ss", "dof"}`` (``None``: none measured)."""
    return relative_sd(float(noise["ss"]), int(noise["dof"])) if noise and noise.get("dof") else None
