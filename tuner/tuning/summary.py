"""What a search decided, as data: best.json's ``summary`` (:data:`VERSION`), which the
console, ``--explain`` and whoever reads a run folder render or read, so no tool parses a
sentence to learn a decision.

It holds the answer (its changes from the baseline), the speedup and its paired interval,
the run's noise, each decision (the change, its verdict, a reason from :data:`REASONS`, the
effect with its interval), the bottleneck before and after, the attribution's steps, the
questions the finish left open, and warnings (a code from :data:`WARNINGS` with its figures).
:func:`of` builds it from a search's result (:class:`Result`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from tuner.analysis.attribution import changed
from tuner.inputs.levers import LEVERS
from tuner.stats.interval import Slowdown, relative_sd
from tuner.tuning import promises

if TYPE_CHECKING:
    from tuner.analysis.attribution import Attribution
    from tuner.analysis.diagnose import Verdict

VERSION = 1
"""The summary's schema version (``docs/summary.schema.json``); a reader checks it."""
VERDICTS = ("kept", "dropped", "undecided")
REASONS = ("gain", "needed", "straddles", "unproven_drop", "no_interval", "no_finish", "cheap", "memory_unneeded",
           "baseline_stays", "measured_slower", "unrecorded")
"""Why a change was kept, dropped or left undecided. Kept: ``gain`` (the answer without it is
slower beyond the tolerance), ``needed`` (the answer without it is ruled out: over the memory
budget, failed, off the fp32 curve). Undecided, and kept: ``straddles`` (the interval straddles
the tolerance), ``unproven_drop`` (within the tolerance in the answer, but not shown so against
the reference, on its pairs, or through the guards), ``no_interval``, ``no_finish``. Dropped:
``cheap`` (the answer without it is within the tolerance of the reference), ``memory_unneeded``
(a memory lever not shown a gain), ``baseline_stays`` (the answer was not shown faster than the
baseline, which measured faster). Undecided, and left: ``measured_slower`` (the finish's
own paired runs measured the answer without it faster). ``unrecorded``: a run folder written before reasons were."""
WARNINGS = ("noisy", "open", "target_not_met", "no_baseline", "nothing_ran", "broken", "path_unmeasured")
"""What the reader should know before trusting the answer: ``noisy`` (the run's noise is above
the published table's noisiest row), ``open`` (questions the finish's budget left open),
``target_not_met``, ``no_baseline`` (the baseline did not run), ``nothing_ran``, ``broken``
(the job fails whatever the knobs), ``path_unmeasured`` (attribution steps not measured)."""


@dataclass(frozen=True)
class Effect:
    """How much faster with a change than without it (``gain`` 0.05: 5%), with the 99%
    interval, over ``pairs`` interleaved rounds (0: unpaired runs)."""

    gain: float
    low: float
    high: float
    pairs: int

    @classmethod
    def of(cls, slowdown: Mapping[str, Any] | None) -> "Effect | None":
        """From the interval of how much slower the configuration without the change is."""
        if not slowdown:
            return None
        s = Slowdown.from_json(slowdown)
        gain, low, high = s.gains
        return cls(gain, low, high, s.pairs)


@dataclass(frozen=True)
class Change:
    """One decision: ``knob`` (an attribution step: two knobs joined by ``+`` move together)
    at ``value``, its ``verdict`` (:data:`VERDICTS`) and ``reason`` (:data:`REASONS`), and the
    search trials its evidence rests on (``trials``: the answer's, ``with`` the change, and
    the configuration ``without`` it; the finish's rounds are the effect's pairs)."""

    knob: str
    value: Any
    verdict: str
    reason: str
    effect: Effect | None
    trials: Mapping[str, list[int]] | None = None


@dataclass(frozen=True)
class Bottleneck:
    """A configuration's first verdict: its ``kind`` (``None``: none stands out), the share of
    the step it explains, the rate a stall-free step reached (where replayed), and what it
    advises next: each step's lever, or the step's code where it moves none (its words:
    :data:`tuner.outputs.diagnosis.STEPS`), less what the trials already took."""

    kind: str | None
    share: float
    ceiling: float | None
    next: tuple[str, ...]


@dataclass(frozen=True)
class Step:
    """One change on the attribution's path from the baseline: its ``gain`` (after / before)
    and ``share`` of the whole speedup (log scale), or why it ``failed``."""

    knob: str
    before: Any
    after: Any
    gain: float | None
    share: float | None
    failed: dict[str, Any] | str | None
    """Why its configuration never ran (:attr:`tuner.analysis.attribution.Row.failed`)."""


@dataclass(frozen=True)
class Open:
    """A question the finish left open: ``kind`` (``change``, ``finalist``, ``baseline``),
    its ``step``, the ``side`` it was asked of, and its effect so far."""

    kind: str
    step: str
    side: str
    effect: Effect | None


@dataclass(frozen=True)
class Warning:
    code: str
    figures: Mapping[str, Any]


@dataclass(frozen=True)
class Ratio:
    """The answer's speedup over the baseline in the rounds both ran, with its 99% interval."""

    speedup: float
    low: float
    high: float
    pairs: int


@dataclass(frozen=True)
class Summary:
    tolerance: float | None
    """The largest slowdown a simpler answer may cost: what each verdict was read against."""
    stopped: str
    """Why the search stopped (``trials``, ``minutes``, ``converged``, ``exhausted``, ``target``,
    ``interrupted``, ``broken``)."""
    trials: int
    answer: Mapping[str, Any]
    """The answer's changes from the baseline (``{}``: the baseline is the answer)."""
    baseline_rate: float | None
    rate: float | None
    speedup: float | None
    paired: Ratio | None
    noise: float | None
    """One run's relative standard deviation in this run (``None``: nothing measured twice)."""
    decisions: tuple[Change, ...]
    before: Bottleneck | None
    after: Bottleneck | None
    """``None`` where the answer is the baseline, or it did not run."""
    attribution: tuple[Step, ...]
    open: tuple[Open, ...]
    warnings: tuple[Warning, ...]
    out: str
    command: str | None
    """The command that measures the answer again."""
    version: int = VERSION

    def kept_unproven(self) -> list[str]:
        """The changes the answer keeps without evidence that they help."""
        return [c.knob for c in self.decisions if c.verdict == "undecided" and c.reason != "measured_slower"]

    def to_json(self) -> dict[str, Any]:
        return _finite(asdict(self))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Summary":
        """A summary as best.json holds it; ``ValueError`` for another schema version."""
        if data.get("version") != VERSION:
            raise ValueError(f"summary version {data.get('version')!r}; this tuner reads version {VERSION}")

        def effect(e: Mapping[str, Any] | None) -> Effect | None:
            return Effect(**{k: math.inf if v is None else v for k, v in e.items()}) if e else None

        def bottleneck(b: Mapping[str, Any] | None) -> Bottleneck | None:
            return Bottleneck(b["kind"], b["share"], b["ceiling"], tuple(b["next"])) if b else None

        return cls(
            data["tolerance"], data["stopped"], data["trials"], data["answer"], data["baseline_rate"], data["rate"],
            data["speedup"],
            Ratio(**data["paired"]) if data.get("paired") else None, data["noise"],
            tuple(Change(c["knob"], c["value"], c["verdict"], c["reason"], effect(c["effect"]), c.get("trials"))
                  for c in data["decisions"]),
            bottleneck(data.get("before")), bottleneck(data.get("after")),
            tuple(Step(**s) for s in data["attribution"]),
            tuple(Open(o["kind"], o["step"], o["side"], effect(o["effect"])) for o in data["open"]),
            tuple(Warning(w["code"], w["figures"]) for w in data["warnings"]), data["out"], data["command"])


def _finite(value: Any) -> Any:
    """JSON holds no infinity: an unbounded interval's end is ``null``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class Result(Protocol):
    """What a summary is made of (:class:`~tuner.tuning.search_result.SearchResult` is one)."""

    out: Any
    best: dict[str, Any]
    baseline: dict[str, Any]
    speedup: float | None
    target_met: bool
    stopped: str
    trials: int
    diagnosis: dict[str, list["Verdict"]]
    attribution: "Attribution | None"
    decision: dict[str, Any] | None
    broken: str | None
    noise: dict[str, float] | None
    paired: dict[str, Any] | None
    target: dict[str, float] | None


def of(result: Result) -> Summary:
    """The summary of a search's result (a result read back from an older best.json too)."""
    best, base = result.best.get("params") or {}, result.baseline.get("params") or {}
    decision = result.decision or {}
    rates = [(part.get("metrics") or {}).get("samples_per_s") for part in (result.baseline, result.best)]
    same = not best or best == base
    return Summary(
        tolerance=decision.get("tolerance"), stopped=result.stopped, trials=result.trials,
        answer={k: best.get(k, LEVERS[k].default) for k in changed(base, best)} if best else {},
        baseline_rate=rates[0], rate=rates[1], speedup=result.speedup,
        paired=Ratio(**result.paired) if result.paired else None,
        noise=relative_sd(float(result.noise["ss"]), int(result.noise["dof"])) if result.noise else None,
        decisions=tuple(Change(e["knob"], e["value"], e["label"], e.get("reason", "unrecorded"),
                               Effect.of(e.get("slowdown")), e.get("trials")) for e in decision.get("knobs", [])),
        before=_bottleneck(result, "baseline"), after=None if same else _bottleneck(result, "best"),
        attribution=tuple(Step(r.knob, r.before, r.after, r.gain, r.share, r.failed)
                          for r in (result.attribution.rows if result.attribution else [])),
        open=tuple(Open(q["kind"], q["step"], q["side"], Effect.of(q.get("slowdown")))
                   for q in decision.get("open", []) if isinstance(q, Mapping)),
        warnings=tuple(_warnings(result, decision)), out=str(result.out), command=result.best.get("command"))


def _bottleneck(result: Result, name: str) -> Bottleneck | None:
    verdicts, metrics = result.diagnosis.get(name), getattr(result, name).get("metrics")
    if verdicts is None or not metrics:
        return None
    if not verdicts:
        return Bottleneck(None, 0.0, None, ())
    v = verdicts[0]
    replayed = metrics.get("stall_free_method") != "window minus waits"  # the shortcut is no evidence
    return Bottleneck(v.kind, v.weight, metrics.get("stall_free_samples_per_s") if replayed else None,
                      tuple(s.lever or s.code for s in v.steps))


def _warnings(result: Result, decision: Mapping[str, Any]) -> list[Warning]:
    out = []
    noise = relative_sd(float(result.noise["ss"]), int(result.noise["dof"])) if result.noise else None
    if promises.too_noisy(result.noise):
        out.append(Warning("noisy", {"noise": noise, "noisiest_row": promises.sigmas()[-1]}))
    if result.target and not result.target_met:
        out.append(Warning("target_not_met", dict(result.target)))
    if result.broken:
        out.append(Warning("broken", {"why": result.broken}))
    if not (result.best.get("metrics")):
        out.append(Warning("nothing_ran", {}))
    elif not result.baseline.get("metrics"):
        out.append(Warning("no_baseline", {}))
    if decision.get("open"):
        out.append(Warning("open", {"questions": len(decision["open"]), "budget_s": decision.get("budget_s"),
                                    "out_of_reach": bool(decision.get("out_of_reach"))}))
    rows = result.attribution.rows if result.attribution else []
    unmeasured = [r.knob for r in rows if not r.gain and not r.failed]
    if unmeasured:
        out.append(Warning("path_unmeasured", {"steps": unmeasured}))
    return out
