"""Verdicts that use every trial, not one configuration's window alone.

One window says where its step's time goes; the search's trials say what changing it did:
more workers that took the data wait away and samples/s down (decode and the model share
the cores), or a peak that grows with the workers (host memory they hold, not the device's).
:func:`revise` corrects a configuration's verdicts with that evidence.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from tuner.analysis.diagnose import THRESHOLDS, Verdict
from tuner.analysis.remedies import Step
from tuner.inputs import levers
from tuner.stats.interval import Slowdown

LOADER = levers.of("loader")
"""The loader's knobs: a change in these alone is a loader change."""
NO_GAIN = 1.10
"""More workers that did not make samples/s at least this many times faster, while they
removed the wait or filled the cores, bought nothing a search can tell from noise (whole
trials differ by 5-10% on a shared machine; the issue's JPEG pipeline lost 6%)."""
WAIT_GONE = 0.5
"""The data wait counts as removed when it fell below this fraction of what it was."""
FAMILY_FIRST: dict[str, tuple[str, ...]] = {kind: levers.pointed_at(kind) for kind in levers.verdict_kinds()}
"""The knobs a verdict points at (each lever's ``verdicts``): the search tries them first
(:mod:`tuner.tuning.proposing.guided`), and a verdict says which of them the trials already moved
without gain."""
SATURATED = 0.85
"""Busy cores (main process + workers) at or above this fraction of the cores available."""
Compare = Callable[[Mapping[str, Any], Mapping[str, Any]], "Slowdown | None"]
"""How much slower the second configuration is than the first, with its interval from every
run of both (:meth:`tuner.tuning.pool.Pool.slowdown`: paired where they shared rounds)."""
MEMORY_PER_WORKER_GIB = 0.05
"""Peak memory growing by more than this per loader worker is the workers' own memory."""


@dataclass(frozen=True)
class Seen:
    """One measured trial: its knobs and metrics (of a trial the prune rule cut, only the
    samples/s it was cut at)."""

    params: Mapping[str, Any]
    metrics: Mapping[str, Any]


def revise(verdicts: Sequence[Verdict], params: Mapping[str, Any], metrics: Mapping[str, Any] | None,
           trials: Sequence[Seen], cores: int, compare: Compare | None = None) -> list[Verdict]:
    """``verdicts`` of the configuration ``params``, corrected by what the ``trials`` did
    (``cores``: the CPUs the job may run on; ``compare``: the interval between two
    configurations, which a claim of what workers did is printed with)."""
    out = list(verdicts)
    if not metrics:
        return out
    saturated = (cores_busy(params, metrics, cores) or host_cpu_saturated(params, metrics, trials, cores, compare)
                 or workers_bought_nothing(params, metrics, trials, cores, compare))
    if saturated is not None:
        # the cores explain both the wait and a step short of its stall-free ceiling
        out = [saturated] + [v for v in out if v.kind not in ("data-bound", "compute-bound")]
    slope = memory_per_worker(trials)
    if slope is not None:
        out = [_loader_memory(v, slope, params) if v.kind == "memory-bound" else v for v in out]
    out = [_already_tried(v, params, metrics, trials, compare) for v in out]
    return sorted(out, key=lambda v: -v.weight)


def _already_tried(v: Verdict, params: Mapping[str, Any], metrics: Mapping[str, Any],
                   trials: Sequence[Seen], compare: Compare | None = None) -> Verdict:
    """Name the verdict's knobs the trials already moved from ``params``: the next step is then
    elsewhere, and the verdict records what the move did (``measured``).

    A move counts where only that knob changed, or only knobs of the verdict's own family
    (recorded with it: num_workers 4 with prefetch_factor 4): the quick start searches the
    loader's knobs together. A move without a gain of :data:`NO_GAIN` is listed by its values
    (``flat``); one that gained more, on the estimate its figure is printed from (:func:`_gain`),
    by the largest gain with its effect (``gained``), so the advice never stands beside trials
    that already took it."""
    rate = metrics.get("samples_per_s") or 0.0
    family = FAMILY_FIRST.get(v.kind, ())
    flat: list[dict[str, Any]] = []
    gained: list[dict[str, Any]] = []
    steps = list(v.steps)
    here = Seen(params, metrics)
    named_moves: set[tuple[str, ...]] = set()  # a joint move is named once, under the first knob it moved
    for knob in family:
        alone: set[Any] = set()
        together: dict[Any, tuple[dict[str, Any], tuple[str, ...]]] = {}
        best: Seen | None = None
        best_gain = NO_GAIN - 1  # the bar: a move is a gain on the estimate its figure is printed from
        for t in trials:
            value, sps = t.params.get(knob), t.metrics.get("samples_per_s")
            if value == params.get(knob) or not sps or not rate or not _alike(t.params, params, family):
                continue
            if (gain := _gain(t, here, compare)) >= NO_GAIN - 1:
                if best is None or gain > best_gain:
                    best, best_gain = t, gain
            elif _alike(t.params, params, (knob,)):
                alone.add(value)
            else:
                together.setdefault(value, (_moved(t, params, family, knob), _move_of(t, params, family)))
        joint = {x: moved for x, (moved, move) in together.items() if x not in alone and move not in named_moves}
        named = {**joint, **{x: {"value": x, "with": {}} for x in alone}}
        named_moves.update(together[x][1] for x in joint)
        if named:
            flat.append({"knob": knob, "moves": [named[x] for x in sorted(named, key=str)]})
        tried = set(named) | set(together)
        if best is not None:
            tried.add(best.params[knob])
            if (move := _move_of(best, params, family)) not in named_moves:
                named_moves.add(move)
                gained.append({"knob": knob, **_moved(best, params, family, knob),
                               "effect": _effect(best, here, compare)})
        if tried:
            steps = [s for s in steps if not _taken(s, knob, tried, params)]
    if not flat and not gained:
        return v
    return replace(v, steps=tuple(steps), measured={"flat": flat, "gained": gained, "bar": NO_GAIN - 1})


def _move_of(t: Seen, params: Mapping[str, Any], family: Sequence[str]) -> tuple[str, ...]:
    """The knobs of ``family`` that ``t`` moved from ``params``, with their values: one move."""
    return tuple(f"{k}={t.params.get(k)}" for k in family if t.params.get(k) != params.get(k))


def _moved(t: Seen, params: Mapping[str, Any], family: Sequence[str], knob: str) -> dict[str, Any]:
    """``t``'s value of ``knob``, and the other knobs of ``family`` it moved too."""
    return {"value": t.params.get(knob),
            "with": {k: t.params.get(k) for k in family if k != knob and t.params.get(k) != params.get(k)}}


def _taken(step: Step, knob: str, tried: set[Any], params: Mapping[str, Any]) -> bool:
    """Whether the trials already moved ``knob`` to what ``step`` advises (advice beside its own
    refutation reads as noise): each value it names, or for an ordered lever's "a larger ...",
    a larger value than ``params``'s."""
    if step.lever != knob:
        return False
    lever = levers.LEVERS[knob]
    advised = (step.figures.get("values") or lever.advises or lever.suggest[0]) if lever.suggest else ()
    if advised:
        return set(advised) <= tried
    current = params.get(knob)
    return any(isinstance(x, (int, float)) and isinstance(current, (int, float)) and x > current for x in tried)


DERIVED = ("grad_accum_steps", "engine")
"""Recorded with a configuration's knobs but following from them (micro-batch, ZeRO stage)."""


def _alike(a: Mapping[str, Any], b: Mapping[str, Any], free: Sequence[str]) -> bool:
    """Whether two configurations differ in the ``free`` knobs only."""
    return all(a.get(k) == b.get(k) for k in set(a) | set(b) if k not in free and k not in DERIVED)


def _busy(metrics: Mapping[str, Any]) -> float:
    """Cores the main process and the loader workers kept busy over the window."""
    return (metrics.get("cpu_util") or 0.0) + (metrics.get("worker_cpu_util") or 0.0)


def cores_busy(params: Mapping[str, Any], metrics: Mapping[str, Any], cores: int) -> Verdict | None:
    """The loop waits for its workers while every core is busy: no idle core for more."""
    wait, busy = metrics.get("data_wait_share") or 0.0, _busy(metrics)
    workers = params.get("num_workers") or 0
    if wait <= THRESHOLDS["data_wait_share"] or not workers or busy < SATURATED * cores:
        return None
    return Verdict("host-cpu-saturated", wait, "cores-busy", {"wait": wait, "workers": workers, "busy": busy,
                                                               "cores": cores}, (Step("no_more_workers"),))


def host_cpu_saturated(params: Mapping[str, Any], metrics: Mapping[str, Any],
                       trials: Sequence[Seen], cores: int, compare: Compare | None = None) -> Verdict | None:
    """More workers removed the wait (or filled the cores) but not the time: the host's
    cores are the limit."""
    wait, rate = metrics.get("data_wait_share") or 0.0, metrics.get("samples_per_s") or 0.0
    if wait <= THRESHOLDS["data_wait_share"] or not rate:
        return None
    workers = params.get("num_workers") or 0
    tried = [t for t in trials if _alike(t.params, params, LOADER) and (t.params.get("num_workers") or 0) > workers
             and t.metrics.get("samples_per_s")]
    here = Seen(params, metrics)
    if not tried or any(_gain(t, here, compare) >= NO_GAIN - 1 for t in tried):
        return None
    cleared = [t for t in tried if (t.metrics.get("data_wait_share") is not None
                                    and t.metrics["data_wait_share"] < WAIT_GONE * wait)
               or _busy(t.metrics) >= SATURATED * cores]  # a trial cut before its window ended measured neither
    if not cleared:
        return None
    t = max(cleared, key=lambda s: s.metrics["samples_per_s"])
    effect = _effect(t, here, compare)
    return Verdict("host-cpu-saturated", wait, "workers-cleared-the-wait",
                   {"wait": wait, "workers": t.params["num_workers"],
                    "wait_then": t.metrics.get("data_wait_share") or 0.0, "effect": effect,
                    "busy": _busy(t.metrics), "cores": cores}, (_no_gain(effect),))


def workers_bought_nothing(params: Mapping[str, Any], metrics: Mapping[str, Any],
                           trials: Sequence[Seen], cores: int, compare: Compare | None = None) -> Verdict | None:
    """The workers this configuration has took the wait down from a configuration with fewer
    but bought no time over it: more will not either (:func:`host_cpu_saturated` looks only
    at trials with *more* workers than the configuration)."""
    wait, rate = metrics.get("data_wait_share") or 0.0, metrics.get("samples_per_s") or 0.0
    workers = params.get("num_workers") or 0
    if not rate or not workers:  # a wait under the data-bound threshold too: the time, not the wait, tells
        return None
    fewer = [t for t in trials if _alike(t.params, params, LOADER) and (t.params.get("num_workers") or 0) < workers
             and t.metrics.get("samples_per_s")
             and (t.metrics.get("data_wait_share") or 0.0) * WAIT_GONE > wait]
    here = Seen(params, metrics)
    if not fewer or any(_gain(here, t, compare) >= NO_GAIN - 1 for t in fewer):
        return None
    t = min(fewer, key=lambda s: s.params.get("num_workers") or 0)
    effect = _effect(here, t, compare)
    return Verdict("host-cpu-saturated", wait, "workers-bought-nothing",
                   {"fewer": t.params.get("num_workers") or 0, "workers": workers,
                    "wait_before": t.metrics.get("data_wait_share") or 0.0, "wait": wait, "effect": effect,
                    "busy": _busy(metrics), "cores": cores}, (_no_gain(effect),))


def _gain(more: Seen, fewer: Seen, compare: Compare | None) -> float:
    """``more``'s gain in samples/s over ``fewer``, as :func:`_effect` prints it: the interval's
    estimate where there is one (paired where the finish measured both), else the ratio of the
    two medians; the move is chosen on the same figure it is printed with."""
    s = compare(more.params, fewer.params) if compare is not None else None
    if s is not None:
        return s.gains[0]
    return more.metrics["samples_per_s"] / fewer.metrics["samples_per_s"] - 1


def _effect(more: Seen, fewer: Seen, compare: Compare | None) -> dict[str, Any]:
    """What the configuration ``more`` (more workers, or one knob moved) did to samples/s
    against ``fewer``: the ratio of the medians (``point``), the interval from every run of
    both (``interval``; ``None``: no noise measured yet), and whether it shows no gain of
    :data:`NO_GAIN` (``shown``): a claim of what a move did carries the interval that says
    whether the runs behind it can bear it."""
    point = more.metrics["samples_per_s"] / fewer.metrics["samples_per_s"] - 1
    s = compare(more.params, fewer.params) if compare is not None else None
    return {"point": point, "interval": s.to_json() if s is not None else None,
            "shown": s is not None and s.within(1 - 1 / NO_GAIN)}


def _no_gain(effect: Mapping[str, Any]) -> Step:
    """More workers will not help: shown by the interval, or only not shown to help."""
    return Step("no_gain_shown" if effect["shown"] else "no_gain_not_shown", figures={"bar": NO_GAIN - 1})


def memory_per_worker(trials: Sequence[Seen]) -> float | None:
    """GiB of peak memory each loader worker adds across the trials (a least-squares slope
    over three or more worker counts, with a tight fit), or ``None``."""
    points = []
    for t in trials:
        peak = t.metrics.get("host_mem_gib") or t.metrics.get("peak_mem_gib")
        if peak is not None and t.params.get("num_workers") is not None:
            points.append((float(t.params["num_workers"]), float(peak)))
    if len({x for x, _ in points}) < 3:
        return None
    xs, ys = [x for x, _ in points], [y for _, y in points]
    fit = statistics.linear_regression(xs, ys)
    r = statistics.correlation(xs, ys) if statistics.pstdev(ys) > 0 else 0.0
    return fit.slope if fit.slope > MEMORY_PER_WORKER_GIB and r > 0.8 else None


def _loader_memory(v: Verdict, slope: float, params: Mapping[str, Any]) -> Verdict:
    return replace(v, kind="loader-memory-bound", code="loader-memory-bound",
                   figures={**v.figures, "slope": slope, "workers": params.get("num_workers") or 0},
                   steps=(Step("share_dataset_memory"),))
