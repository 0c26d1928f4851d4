"""The method before the sampler: locate the bottleneck, change one thing at a time."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from tuner.tuning.searchspace import Space

WAIT_WORTH_FIXING = 0.05
"""A data-wait share above this says the loader is (part of) the bottleneck."""
COORDINATE_ORDER = ("amp_dtype", "micro_batch_size", "zero_stage", "num_workers", "prefetch_factor",
                    "persistent_workers", "pin_memory")
"""Knobs tried one at a time around the best so far, the likeliest large effects first."""


def guided_next(space: Space, incumbent: Mapping[str, Any], metrics: Mapping[str, Any],
                tried: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The method, before the sampler: locate the bottleneck, change one thing at a time.

    From the best configuration so far (``incumbent``, with its ``metrics``): while the
    loop waits on data, the next larger number of loader workers (persistent, deepest
    prefetch); a step up that did not win ends the climb, since the incumbent then still
    has fewer workers. Then each other value of each knob, one knob at a time; larger
    micro-batches first (fewer accumulation steps, fuller kernels; an OOM is just an
    infeasible trial). Returns the first such neighbour not yet ``tried``, or ``None``
    when the neighbourhood is exhausted and the sampler takes over.
    """
    c = space.choices
    start = {k: v if v in c[k] else c[k][0] for k, v in incumbent.items() if k in c}
    more = sorted(w for w in c["num_workers"] if w > start["num_workers"])
    if (metrics.get("data_wait_share") or 0.0) > WAIT_WORTH_FIXING and more:
        candidate = dict(start, num_workers=more[0], prefetch_factor=max(c["prefetch_factor"]))
        if True in c["persistent_workers"]:
            candidate["persistent_workers"] = True
        if not tried(candidate):
            return candidate
    for name in COORDINATE_ORDER:
        values = sorted(c[name], reverse=True) if name == "micro_batch_size" else c[name]
        for value in values:
            candidate = dict(start, **{name: value})
            if value != start[name] and not tried(candidate):
                return candidate
    return None
