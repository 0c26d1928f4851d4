"""Which change bought how much: from the baseline to the best, one knob at a time.

The path changes the knobs that differ in a fixed, sensible order (the loader first, then
precision, micro-batch, ZeRO); every configuration on it is measured ``repeats`` times,
interleaved with the others, and its median counts. Gains multiply, so each knob's share
is its share of the log of the total gain: the forward shares add up to 100% by
construction. Leave-one-out (the best with one knob put back) says what each knob is worth
*given the others*; when the two disagree beyond the spread of the repeats, the knobs
interact and the table says so rather than pretending the shares are independent.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

ORDER = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "amp_dtype",
         "micro_batch_size", "zero_stage")
"""The order the path changes knobs in: what feeds the step first, then the step itself."""

RISKS = {
    "num_workers": "host memory: every worker holds its own copy of what the dataset touches",
    "prefetch_factor": "host memory: workers x prefetch_factor batches are in flight",
    "persistent_workers": "workers keep their state between epochs (a dataset that changes per epoch must allow it)",
    "pin_memory": "pinned host memory is locked: too much starves the OS",
    "amp_dtype": "numerics: checked by the precision guard against the fp32 loss",
    "micro_batch_size": "optimisation: same global batch, but BatchNorm statistics and padding are per micro-batch",
    "zero_stage": "checkpoints are partitioned (DeepSpeed's zero_to_fp32.py consolidates them)",
}
INTERACTION = 0.25
"""Forward and leave-one-out shares further apart than this (and than the repeats'
spread) mean the knob's worth depends on the others."""


def path(baseline: Mapping[str, Any], best: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``[(knob changed, configuration)]`` from the baseline to the best, baseline first
    (knob ``""``); knobs equal in both are left out."""
    steps: list[tuple[str, dict[str, Any]]] = [("", dict(baseline))]
    current = dict(baseline)
    for knob in ORDER:
        if baseline.get(knob) != best.get(knob):
            current = {**current, knob: best[knob]}
            steps.append((knob, dict(current)))
    return steps


def leave_one_out(baseline: Mapping[str, Any], best: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``[(knob put back, the best with that knob at its baseline value)]``."""
    return [(k, {**best, k: baseline[k]}) for k in ORDER if baseline.get(k) != best.get(k)]


@dataclass
class Row:
    knob: str
    before: Any
    after: Any
    samples_per_s: float | None
    """Median after this change (``None``: the configuration failed)."""
    gain: float | None
    """samples/s after / before this change."""
    share: float | None
    """This change's share of the total gain (log scale; the forward shares add up to 1)."""
    without: float | None
    """The best's samples/s with only this knob put back (leave-one-out)."""
    loo_share: float | None
    """What putting it back costs, as a share of the total gain (log scale)."""
    risk: str
    failed: str | None = None


@dataclass
class Attribution:
    baseline: float | None
    best: float | None
    rows: list[Row] = field(default_factory=list)
    repeats: int = 0
    spread: float = 0.0
    """Largest relative half-range of the repeats over all configurations measured."""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "best": self.best, "repeats": self.repeats, "spread": self.spread,
                "notes": self.notes, "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Attribution":
        return cls(data.get("baseline"), data.get("best"), [Row(**r) for r in data.get("rows", [])],
                   int(data.get("repeats", 0)), float(data.get("spread", 0.0)), list(data.get("notes", [])))


def attribute(
    baseline: Mapping[str, Any],
    best: Mapping[str, Any],
    rates: Mapping[str, Sequence[float]],
    failures: Mapping[str, str],
    batch_norm: bool = False,
) -> Attribution:
    """The table from the measured rates.

    Args:
        rates: samples/s of each repeat, by :func:`key` of the configuration.
        failures: why a configuration never ran, by key.
        batch_norm: the model holds BatchNorm layers (sharpens the micro-batch risk note).
    """
    def median(config: Mapping[str, Any]) -> float | None:
        values = rates.get(key(config))
        return statistics.median(values) if values else None

    forward, loo = path(baseline, best), dict(leave_one_out(baseline, best))
    base_rate, best_rate = median(forward[0][1]), median(best)
    total = math.log(best_rate / base_rate) if base_rate and best_rate else None
    out = Attribution(base_rate, best_rate, repeats=max((len(v) for v in rates.values()), default=0))
    spreads = [(max(v) - min(v)) / 2 / statistics.median(v) for v in rates.values() if len(v) > 1]
    out.spread = max(spreads, default=0.0)
    previous = base_rate
    for knob, config in forward[1:]:
        rate = median(config)
        gain = rate / previous if rate and previous else None
        without = median(loo[knob])
        risk = RISKS[knob]
        if knob == "micro_batch_size" and batch_norm:
            risk = "BatchNorm in the model: its statistics are per micro-batch, so this changes what it learns"
        out.rows.append(Row(
            knob=knob, before=baseline[knob], after=best[knob], samples_per_s=rate, gain=gain,
            share=math.log(gain) / total if gain and total else None,
            without=without,
            loo_share=math.log(best_rate / without) / total if without and best_rate and total else None,
            risk=risk, failed=failures.get(key(config)),
        ))
        previous = rate
    if total is not None and out.rows:
        threshold = max(INTERACTION, 2 * out.spread / abs(total)) if total else INTERACTION
        mixed = [r.knob for r in out.rows if r.share is not None and r.loo_share is not None
                 and abs(r.share - r.loo_share) > threshold]
        if mixed:
            out.notes.append(
                f"{', '.join(mixed)}: worth a different share on its own path than when taken away from the "
                "best: the knobs interact, so read the shares as this path's, not as independent effects")
        loo_total = sum(r.loo_share for r in out.rows if r.loo_share is not None)
        out.notes.append(f"taken away one at a time, the knobs account for {loo_total:.0%} of the total gain "
                         "(100% when their effects are independent)")
    return out


def key(config: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={config.get(k)}" for k in ORDER)
