"""What the decisions promise, read off the measured table
(:mod:`tuner.tuning.characteristics_table`, written by ``scripts/operating_characteristics.py``
from the finish as it ships): the rates above every report, and what the table says at a
run's own noise (report.md words both). Nothing here is a bound the code was tuned to."""

from __future__ import annotations

from dataclasses import dataclass
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


def promised() -> list[tuple[float, float, float]]:
    """What every report promises: at each noise of the table, (noise, the most often a real
    :data:`DECISIVE` gain is dropped, the most often such a loss is kept) after a search of
    :data:`TYPICAL_TRIALS` trials or more."""
    return [(s, *rates(s, TYPICAL_TRIALS)) for s in sigmas()]


@dataclass(frozen=True)
class AtNoise:
    """What the table says at a run's noise: its ``row`` (the first as noisy or noisier;
    ``above``: the run is noisier than every row, and the rates are lower bounds) after a
    search of ``length`` trials, the rates a real :data:`DECISIVE` ``gain`` is dropped and a
    ``loss`` kept."""

    sigma: float
    dof: int
    row: float
    length: int
    gain: float
    loss: float
    above: bool


def at_noise(noise: Mapping[str, float] | None, trials: int | None = None) -> AtNoise | None:
    """The table at a run's noise (``{"ss", "dof"}``: its pooled log-rate spread) after a
    search of ``trials`` trials (the table's longest search not longer than it), or ``None``
    when the run measured no noise."""
    sigma = _sigma(noise)
    if sigma is None or noise is None:
        return None
    noises = sigmas()
    row = next((s for s in noises if s >= sigma), noises[-1])
    length = max([n for n in lengths() if trials is not None and n <= trials] or [lengths()[0]])
    return AtNoise(sigma, int(noise["dof"]), row, length, *rates(row, length), above=sigma > noises[-1])


def too_noisy(noise: Mapping[str, float] | None) -> bool:
    """Whether a run's noise is above the table's noisiest row: its keeps and drops are then
    near coin flips (``noisy``, :data:`tuner.tuning.summary.WARNINGS`)."""
    sigma = _sigma(noise)
    return sigma is not None and sigma > sigmas()[-1]


def _sigma(noise: Mapping[str, float] | None) -> float | None:
    """One run's noise from a run's ``{"ss", "dof"}`` (``None``: none measured)."""
    return relative_sd(float(noise["ss"]), int(noise["dof"])) if noise and noise.get("dof") else None
