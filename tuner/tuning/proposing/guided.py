"""The method before the sampler: locate the bottleneck, change one thing at a time.

The incumbent's verdict (:mod:`tuner.analysis.diagnose`, corrected by the trials so far,
:mod:`tuner.analysis.evidence`) chooses which knob family to try first: data-bound, the
loader; communication-bound, the micro-batch and ZeRO; memory-bound, sharding and a
smaller micro-batch; compute- or host-bound, precision and the micro-batch. The other
families follow, so the neighbourhood is still covered before the sampler takes over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from tuner.analysis.diagnose import Verdict
from tuner.inputs import levers
from tuner.inputs.rules import conflict
from tuner.study.searchspace import Space
from tuner.tuning.events import Said

WAIT_WORTH_FIXING = 0.05
"""A data-wait share above this says the loader is (part of) the bottleneck."""
CLIMB_TIE = 0.10
"""A step up in loader workers that measured at most this much slower than the best is a tie,
and the climb goes on to the next: one worker against none buys only one reader's overlap
with the step, so the two run alike where more workers win outright, and one run on a busy
machine moves 10% and more.
"""
COORDINATE_ORDER = levers.by("walk")
"""Knobs tried one at a time around the best so far, the likeliest large effects first."""
SMALLER_FIRST = ("memory-bound", "loader-memory-bound")
"""Verdicts under which smaller values come first (micro-batch, workers): they free memory."""
NO_ROOM = ("oom", "over_budget", "skipped")
"""Trial states that say a configuration did not fit its memory."""
ALTERNATIVES = {name: lever.alternative for name, lever in levers.LEVERS.items() if lever.alternative}
"""Moving to one sharding family leaves the other: FSDP2 and ZeRO never go together."""
ORDERED = tuple(name for name, lever in levers.LEVERS.items() if lever.ordered)
"""Knobs whose values lie on a line (by number, or as given), each step along it buying one
thing at a growing price: a larger micro-batch fewer collectives per sample for memory, a
higher ZeRO stage memory for communication, more checkpointing memory for recompute.
Along such a knob the next value past one that lost to the best is not tried by the
guided step (the sampler may still). DeepSpeed's autotuner stops the same way, at the
first ZeRO stage that does not improve on the one before."""


@dataclass(frozen=True)
class Step:
    knobs: dict[str, Any]
    why: Said
    """Which verdict chose it, for the search log."""


def guided_next(space: Space, incumbent: Mapping[str, Any], metrics: Mapping[str, Any],
                tried: Callable[[dict[str, Any]], bool], verdicts: Sequence[Verdict] = (),
                outcome: Callable[[dict[str, Any]], str | None] = lambda knobs: None,
                rate: Callable[[dict[str, Any]], float | None] = lambda knobs: None) -> Step | None:
    """The next configuration one change away from the best so far (``incumbent``).

    While the loop waits on data (and the verdict is not that the host's cores are
    saturated), the next larger number of loader workers (persistent, deepest prefetch); a
    step up that lost ends the climb, since the incumbent then still has fewer workers, and
    one that measured (``rate``: samples/s) within :data:`CLIMB_TIE` of the best goes on to
    the next. Then a larger micro-batch that did not fit (``outcome`` says a state for
    what was tried), with activation checkpointing: what checkpointing is for. Then each
    other value of each knob, one knob at a time, the headline verdict's family first;
    larger micro-batches first unless memory is the limit, and along an :data:`ORDERED`
    knob never past a value that already lost. Returns the first such
    neighbour not yet ``tried``, or ``None`` when the neighbourhood is exhausted and the
    sampler takes over.
    """
    c = space.choices
    start = {k: v if v in c[k] else c[k][0] for k, v in incumbent.items() if k in c}
    head = verdicts[0] if verdicts else None
    kind = head.kind if head else None
    saturated = any(v.kind == "host-cpu-saturated" for v in verdicts)
    more = sorted(w for w in c["num_workers"] if w > start["num_workers"])
    wait = metrics.get("data_wait_share") or 0.0
    best = metrics.get("samples_per_s")
    for workers in more if wait > WAIT_WORTH_FIXING and not saturated else ():
        candidate = dict(start, num_workers=workers, prefetch_factor=max(c["prefetch_factor"]))
        if True in c["persistent_workers"]:
            candidate["persistent_workers"] = True
        if not tried(candidate):
            return Step(candidate, Said("data_wait", {"wait": wait}))
        measured = rate(candidate)
        if not (best and measured and measured >= (1 - CLIMB_TIE) * best):
            break
    step = _checkpointed_larger(c, start, tried, outcome)
    if step is not None:
        return step
    first = levers.pointed_at(kind) if kind else ()
    for name in first + tuple(n for n in COORDINATE_ORDER if n not in first):
        values = list(c.get(name, ()))
        if name == "micro_batch_size" and kind not in SMALLER_FIRST:
            values = sorted(values, reverse=True)  # fewer accumulation steps, fuller kernels
        elif name in ("micro_batch_size", "num_workers") and kind in SMALLER_FIRST:
            below = sorted((v for v in values if v < start[name]), reverse=True)
            values = below + sorted(v for v in values if v >= start[name])  # the next smaller first
        for value in values:
            candidate = _move(c, start, name, value)
            if candidate is not None and value != start[name] and not tried(candidate) \
                    and not _past_a_loser(c, start, name, value, tried, outcome):
                return Step(candidate, Said("points_at", {"kind": kind, "knob": name}) if name in first
                            else Said("one_at_a_time", {"knob": name}))
    return None


def _past_a_loser(c: Mapping[str, tuple[Any, ...]], start: Mapping[str, Any], name: str, value: Any,
                  tried: Callable[[dict[str, Any]], bool],
                  outcome: Callable[[dict[str, Any]], str | None]) -> bool:
    """Whether, along an :data:`ORDERED` knob, a value between the incumbent's and ``value``
    was already tried and lost (the incumbent is the best). One that did not fit its memory
    says nothing about values that need less (a higher ZeRO stage, more checkpointing, a
    smaller micro-batch); only a larger micro-batch past it cannot fit either."""
    if name not in ORDERED or start.get(name) not in c[name]:
        return False
    line = levers.LEVERS[name].line(c[name])
    if value not in line or start[name] not in line:
        return False
    here, there = line.index(start[name]), line.index(value)
    for m in line[min(here, there) + 1:max(here, there)]:
        moved = _move(c, start, name, m) if m in c[name] else None
        if moved is None or not tried(moved):
            continue
        if outcome(moved) not in NO_ROOM or (name == "micro_batch_size" and there > here):
            return True
    return False


def _move(c: Mapping[str, tuple[Any, ...]], start: Mapping[str, Any], name: str, value: Any) -> dict[str, Any] | None:
    """``start`` with one knob changed (and the other sharding family left, where the
    space allows it); ``None`` when that is no configuration."""
    candidate = dict(start, **{name: value})
    other = ALTERNATIVES.get(name)
    if other is not None and conflict(candidate) is not None and other[1] in c.get(other[0], ()):
        candidate[other[0]] = other[1]
    return candidate if conflict(candidate) is None else None


def _at_default(knobs: Mapping[str, Any], name: str) -> bool:
    return knobs.get(name, levers.LEVERS[name].default) == levers.LEVERS[name].default


def _checkpointed_larger(c: Mapping[str, tuple[Any, ...]], start: Mapping[str, Any],
                         tried: Callable[[dict[str, Any]], bool],
                         outcome: Callable[[dict[str, Any]], str | None]) -> Step | None:
    """A larger micro-batch that ran out of room, tried again with a lever value that
    recomputes activations instead of holding them (``Lever.memory.frees_activations``), the one
    that recomputes least first (checkpointing: selective recomputes half as much as full)."""
    frees = [(name, value) for name in levers.recomputing() if _at_default(start, name)
             for value in levers.LEVERS[name].memory.frees_activations if value in c.get(name, ())]
    if not frees or start.get("micro_batch_size") is None:
        return None
    for micro in sorted(m for m in c["micro_batch_size"] if m > start["micro_batch_size"]):
        state = outcome(dict(start, micro_batch_size=micro))
        if state not in NO_ROOM:
            continue
        for name, value in frees:
            candidate = dict(start, micro_batch_size=micro, **{name: value})
            if not tried(candidate):
                return Step(candidate, Said("frees_activations", {"micro_batch_size": micro, "state": state,
                                                                  "knob": name, "value": value}))
    return None
