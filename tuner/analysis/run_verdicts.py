"""Two runs side by side: one configuration of each, every metric with its ratio, and whether
the difference is beyond the tolerance.

Pure functions of what the run folders hold (the caller reads them:
:func:`tuner.outputs.comparison.compare`). Each row reads the interval of
:mod:`tuner.stats.interval` against the tolerance: ``beyond``, ``within``, ``undecided``, or
``unknown`` with no interval, never "same" on a guess. A rate differs between processes by
more than one process's noise, so two runs are judged only with a between-process noise
given (``process_noise``). Different environments (device, count, world, torch) are refused
(``anyway`` shows them with the differences on top).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from tuner.analysis import gate
from tuner.harness.metrics import METRIC_NAMES
from tuner.stats.interval import LEVEL, LogStats, slowdown, t_quantile

DECIDING = (*gate.DECIDING, "torch")
"""The gate's fields (device, world size, device count) and torch: another PyTorch is
another set of kernels, so its throughput is another machine's."""


@dataclass
class Side:
    """One configuration of one run: its params, its metrics (the median of its runs) and
    every run's metrics."""

    run: str
    which: str
    """``best``, ``baseline`` or ``trial N``."""
    params: dict[str, Any]
    metrics: dict[str, Any]
    runs: list[dict[str, Any]]
    noise: tuple[float, int] = (0.0, 0)
    """The run's pooled spread of log-rates: (sum of squares, degrees of freedom)."""
    environment: dict[str, Any] = field(default_factory=dict)
    tolerance: float | None = None
    """The tolerance the run's search decided with (``None``: not recorded)."""


@dataclass
class Row:
    metric: str
    a: Any
    b: Any
    ratio: float | None
    """b / a."""
    verdict: str | None
    """``beyond`` / ``within`` the tolerance as the interval shows it, ``undecided``
    (neither), ``processes`` (two runs' rates and no between-process noise given),
    ``window`` (the measured window's own figure, :data:`WINDOW`: not judged), ``None``: no
    interval to tell."""
    interval: tuple[float, float] | None = None
    """The interval of b / a - 1."""
    dof: int | None = None
    """Degrees of freedom of the noise behind the interval."""


@dataclass
class Comparison:
    a: Side
    b: Side
    rows: list[Row]
    refused: list[gate.Difference]
    """Environment differences that decide a throughput (empty: comparable)."""
    params: list[tuple[str, Any, Any]]
    """The knobs that differ: (name, a, b)."""
    tolerance: float = 0.02
    process_noise: float | None = None
    """One run's relative noise between two processes, as given (two run folders' rates need it)."""
    differ: list[gate.Difference] = field(default_factory=list)
    """Environment differences that do not void the comparison but may explain it (NCCL,
    the driver, clocks and power limits, NCCL and allocator settings)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "a": {"run": self.a.run, "which": self.a.which, "params": self.a.params},
            "b": {"run": self.b.run, "which": self.b.which, "params": self.b.params},
            "refused": [asdict(d) for d in self.refused], "environment_differs": [asdict(d) for d in self.differ],
            "params_differ": [list(p) for p in self.params], "tolerance": self.tolerance,
            "level": LEVEL, "process_noise": self.process_noise,
            "metrics": [{"metric": r.metric, "a": r.a, "b": r.b, "ratio": r.ratio, "verdict": r.verdict,
                         "interval": list(r.interval) if r.interval else None} for r in self.rows],
        }


TELLING = ("nccl", "driver", "cuda_driver", "cuda", "deepspeed", "python", "gpus")
"""Environment fields that do not void a comparison but often explain it: named when they differ."""


def environment_notes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[gate.Difference]:
    """What differs between two environments beyond :data:`DECIDING`: the versions, the
    GPUs' clocks and power limits, and every NCCL / allocator setting (set on one side only,
    or set differently)."""
    out = gate.differences(a, b, [k for k in TELLING if k in a and k in b])
    sa, sb = a.get("settings"), b.get("settings")
    if isinstance(sa, dict) and isinstance(sb, dict):
        out += [gate.Difference(name, sa.get(name), sb.get(name)) for name in sorted({*sa, *sb})
                if sa.get(name) != sb.get(name)]
    return out


def compare(a: Side, b: Side, tolerance: float | None = None, process_noise: float | None = None) -> Comparison:
    """The comparison of ``a`` and ``b`` at ``tolerance`` (default: the search's recorded
    tolerance, else 2%); ``process_noise``: what two run folders' rates are judged with.
    ``refused`` lists the environment differences that void it (the caller refuses it)."""
    refused = gate.differences(a.environment, b.environment, DECIDING)
    if tolerance is None:
        tolerance = a.tolerance if a.tolerance is not None else b.tolerance if b.tolerance is not None else 0.02
    params = [(k, a.params.get(k), b.params.get(k)) for k in dict.fromkeys([*a.params, *b.params])
              if a.params.get(k) != b.params.get(k)]
    wide = a.noise if a.run == b.run else (a.noise[0] + b.noise[0], a.noise[1] + b.noise[1])
    across = None if a.run == b.run else (process_noise if process_noise is not None else math.nan)
    rows = [_row(name, a, b, wide, tolerance, across) for name in METRIC_NAMES
            if isinstance(a.metrics.get(name), (int, float)) or isinstance(b.metrics.get(name), (int, float))]
    return Comparison(a, b, rows, refused, params, tolerance, process_noise,
                      environment_notes(a.environment, b.environment))


def against(interval: tuple[float, float], tolerance: float) -> str:
    """``beyond``, ``within`` or ``undecided``: where the interval of a relative difference
    lies against ±``tolerance`` (the one rule, read both ways)."""
    low, high = interval
    if low > tolerance or high < -tolerance:
        return "beyond"
    if low > -tolerance and high < tolerance:
        return "within"
    return "undecided"


WINDOW = ("measured_steps", "measured_s", "samples_per_s_ci", "warmup_set_aside")
"""The measured window's own figures (how long it ran, how well it pinned the rate down):
shown with their ratio, not judged against the tolerance (``measured_steps undecided at 2%``
read as a difference between the configurations)."""
RATES = ("samples_per_s", "tokens_per_s", "stall_free_samples_per_s")
"""Metrics that are throughputs: what a process carries as a whole, judged across two runs
only with a between-process noise."""


def _row(name: str, a: Side, b: Side, wide: tuple[float, int], tolerance: float,
         across: float | None = None) -> Row:
    """One metric's row; ``across``: ``None`` within one run, else the between-process
    noise given (NaN: none given)."""
    va, vb = a.metrics.get(name), b.metrics.get(name)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
    ratio = vb / va if numeric and va else None
    if not numeric:
        return Row(name, va, vb, None, None)
    if name in WINDOW:
        return Row(name, va, vb, ratio, "window")
    ra, rb = _values(a.runs, name, va), _values(b.runs, name, vb)
    if name in RATES and across is not None and math.isnan(across):
        return Row(name, va, vb, ratio, "processes")
    if name == "samples_per_s":  # the run-wide noise of rates, as the search decides with
        found = gate.across_processes(LogStats.of(ra), LogStats.of(rb), wide, across) if across is not None \
            else slowdown(ra, rb, wide)  # 1 - b / a
        if found is None:
            return Row(name, va, vb, ratio, None)
        interval = (-found.high, -found.low)  # b / a - 1
        return Row(name, va, vb, ratio, against(interval, tolerance), interval, found.dof)
    return _t_row(name, va, vb, ratio, ra, rb, tolerance)


def _values(runs: Sequence[Mapping[str, Any]], name: str, median: Any) -> list[float]:
    values = [float(r[name]) for r in runs
              if isinstance(r.get(name), (int, float)) and not isinstance(r.get(name), bool)]
    return values or [float(median)]


def _t_row(name: str, va: float, vb: float, ratio: float | None, ra: list[float], rb: list[float],
           tolerance: float) -> Row:
    """Any other metric: a t-interval from the two sides' own repeats (its noise is its own: a
    share's spread is not the rate's). A metric positive in every run (a step time, a peak)
    is read on a log scale, as the rates are: its ratio's interval, which a time's spread
    cannot push below 0 (a difference of means can). One that can be 0 (a share) is a
    difference of means relative to A, its low end at -100% (no metric here is negative)."""
    dof = len(ra) + len(rb) - 2
    if dof < 1 or not va or (len(ra) < 2 and len(rb) < 2):
        return Row(name, va, vb, ratio, None)
    logs = all(x > 0 for x in (*ra, *rb))
    xa, xb = ([math.log(x) for x in ra], [math.log(x) for x in rb]) if logs else (ra, rb)
    ss = sum((x - statistics.fmean(xa)) ** 2 for x in xa) + sum((x - statistics.fmean(xb)) ** 2 for x in xb)
    half = t_quantile(dof) * math.sqrt(ss / dof) * math.sqrt(1 / len(xa) + 1 / len(xb))
    diff = statistics.fmean(xb) - statistics.fmean(xa)
    if logs:
        interval = (math.exp(diff - half) - 1, math.exp(diff + half) - 1)
    else:
        interval = (max(-1.0, (diff - half) / abs(va)), max(-1.0, (diff + half) / abs(va)))
    return Row(name, va, vb, ratio, against(interval, tolerance), interval, dof)
