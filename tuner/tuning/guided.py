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
from tuner.analysis.evidence import FAMILY_FIRST
from tuner.tuning.searchspace import Space

WAIT_WORTH_FIXING = 0.05
"""A data-wait share above this says the loader is (part of) the bottleneck."""
COORDINATE_ORDER = ("amp_dtype", "micro_batch_size", "zero_stage", "num_workers", "prefetch_factor",
                    "persistent_workers", "pin_memory")
"""Knobs tried one at a time around the best so far, the likeliest large effects first."""
SMALLER_FIRST = ("memory-bound", "memory-bound (loader workers)")
"""Verdicts under which smaller values come first (micro-batch, workers): they free memory."""


@dataclass(frozen=True)
class Step:
    knobs: dict[str, Any]
    why: str
    """Which verdict chose it, for the search log."""


def guided_next(space: Space, incumbent: Mapping[str, Any], metrics: Mapping[str, Any],
                tried: Callable[[dict[str, Any]], bool], verdicts: Sequence[Verdict] = ()) -> Step | None:
    """The next configuration one change away from the best so far (``incumbent``).

    While the loop waits on data (and the verdict is not that the host's cores are
    saturated), the next larger number of loader workers (persistent, deepest prefetch); a
    step up that did not win ends the climb, since the incumbent then still has fewer
    workers. Then each other value of each knob, one knob at a time, the headline verdict's
    family first; larger micro-batches first unless memory is the limit. Returns the first
    such neighbour not yet ``tried``, or ``None`` when the neighbourhood is exhausted and
    the sampler takes over.
    """
    c = space.choices
    start = {k: v if v in c[k] else c[k][0] for k, v in incumbent.items() if k in c}
    head = verdicts[0] if verdicts else None
    kind = head.kind if head else "no clear bottleneck"
    saturated = any(v.kind == "host-cpu-saturated" for v in verdicts)
    more = sorted(w for w in c["num_workers"] if w > start["num_workers"])
    wait = metrics.get("data_wait_share") or 0.0
    if wait > WAIT_WORTH_FIXING and more and not saturated:
        candidate = dict(start, num_workers=more[0], prefetch_factor=max(c["prefetch_factor"]))
        if True in c["persistent_workers"]:
            candidate["persistent_workers"] = True
        if not tried(candidate):
            return Step(candidate, f"data-bound: the loop waits for data {wait:.0%} of the step")
    first = FAMILY_FIRST.get(kind, ())
    for name in first + tuple(n for n in COORDINATE_ORDER if n not in first):
        values = list(c[name])
        if name == "micro_batch_size" and kind not in SMALLER_FIRST:
            values = sorted(values, reverse=True)  # fewer accumulation steps, fuller kernels
        elif name in ("micro_batch_size", "num_workers") and kind in SMALLER_FIRST:
            below = sorted((v for v in values if v < start[name]), reverse=True)
            values = below + sorted(v for v in values if v >= start[name])  # the next smaller first
        for value in values:
            candidate = dict(start, **{name: value})
            if value != start[name] and not tried(candidate):
                why = f"{kind} points at {name}" if name in first else f"{name}, one knob at a time"
                return Step(candidate, why)
    return None
