"""The end of a search: the answer decided by the one rule, in interleaved rounds, inside a
budget the finish plans run by run. ``tests/tuning/test_operating_characteristics.py``
simulates this function; docs/search.md's error rates are its output at its defaults.

- **The reference**: the search's best finalist, or the finalist holding all its changes and
  more (:func:`reference_of`). A change leaves the answer only when the rule shows the answer
  without it within the tolerance *of the reference*, so drops never add up past it.
- **The questions**: each other finalist against the reference, each change of the answer
  (leave-one-out), and the baseline (the speedup), each until decided or precise
  (:func:`tuner.stats.decision.settled`).
- **The rounds**: every open question's configuration once beside the reference, widest
  intervals first, read as pairs (:mod:`tuner.stats.interval`).
- **The budget**: :attr:`Budget.seconds` (``--finish-minutes``, else :data:`TIME_SHARE` of
  the search's time), checked before every run, and :attr:`Budget.rounds` (``--confirm``) a
  question. A question the rounds left would likely not settle is asked no more; a change
  open at the end stays or leaves as the finish's own paired runs measured it
  (:func:`_follow_the_estimate`), ``undecided`` with its interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from tuner.analysis import attribution as attribution_mod
from tuner.inputs.levers import LEVERS
from tuner.stats import decision
from tuner.tuning.events import Said
from tuner.tuning.finish_budget import Budget
from tuner.tuning.pool import Pool, key

if TYPE_CHECKING:
    from tuner.stats.interval import Slowdown
    from tuner.trial.trial_result import TrialResult
    from tuner.tuning.events import SearchEvents

FINALISTS = 3
"""Configurations of the search the finish starts from: one noisy search trial must not pick
the winner (a lucky run of a slower configuration outruns the true best)."""
TIME_SHARE = 2.0
"""The finish measures for at most this share of the time the search's trials took
(``--finish-minutes`` sets it instead), whatever remains of ``budget.minutes`` at most."""
ANSWER_PAIRS = 2
"""Rounds a configuration must share with the reference before a drop makes it the answer:
the pooled noise can decide from one (the method verifies an answer with repeated runs)."""
BASELINE_PAIRS = 2
"""Interleaved rounds of the reference and the baseline before the finish ends: the speedup a user
pastes rests on repeated runs, paired (a 2x gain was once reported on "1 run (1 search trial)")."""
MAX_MOVES = 20
"""Moves of the reference or the answer one finish may make: intervals need not be transitive."""

Run = Callable[[dict[str, Any]], "TrialResult"]  # one configuration measured: a trial here, or a script trial
Agree = Callable[[Any], Any]  # rank 0's value on every rank (tuner.harness.distributed.broadcast)


@dataclass(frozen=True)
class Rules:
    """What the finish asks of the search about a configuration."""

    tolerance: float
    make: Callable[[Mapping[str, Any]], dict[str, Any]]
    """A configuration's full params from its knobs (what follows from them derived again)."""
    fine: Callable[[Mapping[str, Any]], bool]
    """Whether it may be the answer: every run fine, inside the budget and the precision guard, in the space."""
    valid: "attribution_mod.Valid | None" = None
    """Whether a set of knob values makes a configuration the layout allows (the leave-one-outs)."""
    proven: Callable[[str], bool] = lambda step: False
    """Whether an attribution step's levers stay only on evidence of a gain (what they buy is
    memory: sharding, offload, checkpointing), where the others stay while undecided."""
    ruled_out: Callable[[Mapping[str, Any]], dict[str, Any] | None] = lambda p: None
    """Why its runs rule a configuration out of the answer (over the memory budget, failed, off
    the loss curve; ``None``: not so). A question with such a side is settled."""


@dataclass
class Question:
    """One open decision: ``richer`` (it has the change; stays when the rule cannot decide)
    against ``simpler``."""

    kind: str
    """``finalist``, ``change`` (the answer with ``step`` put back) or ``baseline``."""
    richer: dict[str, Any]
    simpler: dict[str, Any]
    step: str = ""
    """The attribution step put back (``amp_dtype``, or two knobs joined by ``+``), for a change."""


@dataclass
class Finished:
    """What the finish decided."""

    answer: dict[str, Any]
    reference: dict[str, Any]
    rounds: int = 0
    runs: int = 0
    seconds: float = 0.0
    budget_s: float | None = None
    out_of_budget: bool = False
    """The budget ended it with questions still open."""
    out_of_reach: bool = False
    """It ended early: what was open would take more rounds than the budget holds."""
    faster: bool = False
    """A configuration of the questions was shown faster than the search's pick and became the reference."""
    dropped: list[dict[str, Any]] = field(default_factory=list)
    """Each change that left the answer: ``step``, ``value``, ``reason``
    (:data:`tuner.tuning.summary.REASONS`), the interval that let it go (``slowdown``)."""
    moves: list[dict[str, Any]] = field(default_factory=list)
    """What changed the reference or the answer, in order: ``reason`` (``faster``, or a drop's
    reason), the ``steps`` that left, ``changes`` (a new reference's), ``slowdown``."""
    open: list[dict[str, Any]] = field(default_factory=list)
    """The questions still open at the end (:func:`open_record`)."""


def changes(params: Mapping[str, Any], baseline: Mapping[str, Any]) -> int:
    """Knobs set differently from the baseline (accumulation and engine follow from them)."""
    return sum(params.get(k) != baseline.get(k) for k in LEVERS)


def reference_of(finalists: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any],
                 proven: Callable[[str], bool] = lambda step: False,
                 slower: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] = lambda p, top: False,
                 ) -> dict[str, Any]:
    """The search's best finalist, or the finalist with the most changes that holds every
    change of it and more (ties: the search's ranking): a change measured on top of the best
    stays until the rule shows it costs less than the tolerance to take away.

    A finalist whose extra changes include a lever that stays only on evidence (``proven``:
    ZeRO, FSDP2, offload, checkpointing) is no reference: it would leave at the end unless
    shown a gain, and while it stood every other change would be judged against a slower
    configuration. It is still a finalist, and becomes the reference when shown faster. Nor
    is one the rule already shows slower than the best (``slower``)."""
    top = finalists[0]
    mine = {k: top.get(k) for k in LEVERS if top.get(k) != baseline.get(k)}
    supersets = [p for p in finalists if all(p.get(k) == v for k, v in mine.items())
                 and not any(proven(k) for k in LEVERS if p.get(k) != top.get(k)) and (p is top or not slower(p, top))]
    return dict(max(supersets, key=lambda p: (changes(p, baseline), -finalists.index(p))))


def questions(answer: dict[str, Any], reference: dict[str, Any], finalists: Sequence[dict[str, Any]],
              baseline: dict[str, Any], rules: Rules) -> list[Question]:
    """What is asked of the current answer and reference: each other finalist against the
    reference; each change of the answer (the answer with it put back) against the reference
    and, once the answer is not the reference, against the answer too; the baseline."""
    out: list[Question] = []
    against = [reference] + ([answer] if answer != reference else [])
    for step, knobs in attribution_mod.leave_one_out(baseline, answer, rules.valid):
        without = rules.make(knobs)
        out += [Question("change", richer, without, step) for richer in against]
    for f in finalists:  # after the changes: a finalist that is the answer less one change is that change
        if f != reference:
            simpler = changes(f, baseline) < changes(reference, baseline)
            out.append(Question("finalist", reference, f) if simpler else Question("finalist", f, reference))
    out.append(Question("baseline", reference, dict(baseline)))
    seen: set[tuple[str, str]] = set()
    unique = []
    for q in out:
        pair = (key(q.richer), key(q.simpler))
        if pair not in seen and pair[0] != pair[1]:
            seen.add(pair)
            unique.append(q)
    return unique


def finish(finalists: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any], run: Run, pool: Pool,
           rules: Rules, budget: Budget, agree: Agree = lambda x: x,
           events: "SearchEvents | None" = None) -> Finished | None:
    """Decide the answer among ``finalists`` (best first, by their search trials) and their
    changes from ``baseline``, measuring in interleaved rounds until no question is open or
    the budget (see the module). Every run goes into ``pool``."""
    if not finalists:
        return None
    base = rules.make(baseline)
    ranked = [rules.make(p) for p in finalists]
    reference = reference_of(ranked, base, rules.proven, lambda p, top: decision.judge(
        pool.slowdown(top, p), rules.tolerance) == decision.KEEP)
    out = Finished(answer=dict(reference), reference=dict(reference), budget_s=budget.seconds)
    start = budget.clock()
    others = [p for p in ranked if p != base]  # the baseline is measured anyway, never "a finalist and the baseline"
    if events:
        events.note(Said("finishing", {"finalists": len(others), "tolerance": rules.tolerance,
                                       "budget_s": budget.seconds}))
    while True:
        asked = questions(out.answer, out.reference, ranked, base, rules)
        if len(out.moves) < MAX_MOVES and _move(out, asked, pool, rules, base, events):
            continue
        unsettled = [q for q in asked if not _settled(q, pool, rules, budget, base, out.answer)]
        todo = agree(_reachable(out, unsettled, pool, rules, budget))
        if not todo:
            out.out_of_reach = agree(bool(unsettled))
            break
        if not _round(out, todo, run, pool, budget, agree):
            out.out_of_budget = True
            break
    _prove(out, questions(out.answer, out.reference, ranked, base, rules), pool, rules, base, events)
    _follow_the_estimate(out, ranked, pool, rules, base, events)
    _no_slower_than_the_baseline(out, pool, rules, base, events)
    out.open = [open_record(q, pool, out.answer) for q in questions(out.answer, out.reference, ranked, base, rules)
                if not _settled(q, pool, rules, budget, base, out.answer)]
    out.seconds = budget.clock() - start
    if events and out.open:
        why = "budget" if out.out_of_budget else "reach" if out.out_of_reach else "rounds"
        events.detail(Said("left_open", {"questions": len(out.open), "rounds": out.rounds, "why": why}))
    return out


def _settled(q: Question, pool: Pool, rules: Rules, budget: Budget, base: dict[str, Any],
             answer: dict[str, Any]) -> bool:
    """Nothing more to measure for ``q``: a failure, the rule settled it, or its rounds spent.
    A drop waits for :data:`ANSWER_PAIRS` rounds only where the simpler side could become the
    answer (the DeepSpeed job spent a round verifying micro-batch 128 against 64, as rich)."""
    a, b = pool.entry(q.richer), pool.entry(q.simpler)
    if a.failures or b.failures or rules.ruled_out(q.richer) or rules.ruled_out(q.simpler):
        return True
    s = pool.slowdown(q.richer, q.simpler)
    if s is not None and s.pairs >= budget.rounds:
        return True
    if q.simpler == base and (s is None or s.pairs < BASELINE_PAIRS):
        return False  # the headline speedup rests on a round of its own, whatever the search's trials say
    if not decision.settled(s, rules.tolerance):
        return False
    if decision.judge(s, rules.tolerance) == decision.DROP and s is not None and s.pairs < ANSWER_PAIRS \
            and changes(q.simpler, base) < changes(answer, base):
        return False  # the simpler would become the answer: verified on rounds of its own first
    return True


def _reachable(out: Finished, unsettled: list[Question], pool: Pool, rules: Rules, budget: Budget) -> list[Question]:
    """The open questions that the rounds left in the budget would likely settle
    (:func:`tuner.stats.decision.pairs_to_settle`); the others stay open as they are."""
    configs = {key(p): p for q in unsettled for p in (q.richer, q.simpler)} | {key(out.reference): out.reference}
    left = budget.rounds_left(sum(budget.expected(k) for k in configs))

    def reachable(q: Question) -> bool:
        s = pool.slowdown(q.richer, q.simpler)
        need = decision.pairs_to_settle(s, rules.tolerance, budget.rounds)
        return s is None or need is None or need <= min(s.pairs + left, budget.rounds)

    return [q for q in unsettled if reachable(q)]


def _move(out: Finished, asked: list[Question], pool: Pool, rules: Rules, base: dict[str, Any],
          events: "SearchEvents | None") -> bool:
    """Apply what the rule has decided (True when something moved):

    - a configuration of the questions shown faster than the reference beyond the tolerance,
      and fine, becomes the reference and the answer: a slower reference would let a real
      gain go as "within the tolerance of it";
    - else the configuration with the fewest changes shown within the tolerance of the
      reference and of the answer (every question it is the simpler side of dropped, each on
      :data:`ANSWER_PAIRS` rounds at least), and fine, becomes the answer."""
    tol = rules.tolerance
    for p in {key(x): x for q in asked for x in (q.richer, q.simpler)}.values():
        s = pool.slowdown(p, out.reference)
        if p != out.reference and decision.judge(s, tol) == decision.KEEP and rules.fine(p):
            assert s is not None
            out.reference, out.answer, out.faster = dict(p), dict(p), True
            out.dropped.clear()
            _moved(out, events, tol, {"reason": "faster", "steps": [], "changes": changes(p, base),
                                      "slowdown": s.to_json()})
            return True
    sides: dict[str, list[Question]] = {}
    for q in asked:
        if q.richer in (out.reference, out.answer):
            sides.setdefault(key(q.simpler), []).append(q)
    drops: list[tuple[int, float, dict[str, Any], "Slowdown"]] = []
    for qs in sides.values():
        simpler = qs[0].simpler
        if changes(simpler, base) >= changes(out.answer, base) or not rules.fine(simpler):
            continue
        found = [pool.slowdown(q.richer, simpler) for q in qs]
        if all(s is not None and s.pairs >= ANSWER_PAIRS and decision.judge(s, tol) == decision.DROP for s in found):
            against = pool.slowdown(out.reference, simpler)
            assert against is not None
            drops.append((changes(simpler, base), against.high, simpler, against))
    if not drops:
        return False
    _, _, simpler, s = min(drops, key=lambda d: (d[0], d[1]))
    gone = [k for k in attribution_mod.changed(base, out.answer) if simpler.get(k) != out.answer.get(k)]
    out.dropped += [{"step": k, "value": out.answer.get(k), "slowdown": s.to_json(), "reason": "cheap"} for k in gone]
    out.answer = dict(simpler)
    _moved(out, events, tol, {"reason": "cheap", "steps": gone, "slowdown": s.to_json()})
    return True


def _prove(out: Finished, asked: list[Question], pool: Pool, rules: Rules, base: dict[str, Any],
           events: "SearchEvents | None") -> None:
    """At the end, each change of a lever that stays only on evidence (:attr:`Rules.proven`)
    and was not shown a gain beyond the tolerance leaves the answer, where the answer without
    it was measured and is fine (an answer that does not fit without it keeps it)."""
    tol = rules.tolerance
    for q in asked:
        if q.kind != "change" or q.richer != out.reference or not rules.proven(q.step):
            continue
        s = pool.slowdown(q.richer, q.simpler)
        if decision.judge(s, tol) == decision.KEEP or not pool.entry(q.simpler).rates or not rules.fine(q.simpler):
            continue
        value = out.answer.get(q.step.split("+")[0])
        if all(q.simpler.get(k) == out.answer.get(k) for k in LEVERS if k not in q.step.split("+")):
            slowdown = s.to_json() if s else None
            out.dropped.append({"step": q.step, "value": value, "slowdown": slowdown, "reason": "memory_unneeded"})
            out.answer = dict(q.simpler)
            _moved(out, events, tol, {"reason": "memory_unneeded", "steps": [q.step], "slowdown": slowdown})


def _follow_the_estimate(out: Finished, ranked: Sequence[dict[str, Any]], pool: Pool, rules: Rules,
                         base: dict[str, Any], events: "SearchEvents | None") -> None:
    """At the end, a change still undecided leaves the answer where the finish's own paired runs
    measured the answer without it faster (the estimate's sign, over pairs only): the search's
    single runs chose it, so their reading carries the winner's curse; the finish's fresh runs
    do not. The largest such loss leaves first, then the new answer is read again. It is
    still reported undecided, with its interval; a lever that buys memory is :func:`_prove`'s."""
    tol = rules.tolerance
    while len(out.moves) < MAX_MOVES:
        slower: list[tuple[float, Question, "Slowdown"]] = []
        for q in questions(out.answer, out.reference, ranked, base, rules):
            if q.kind != "change" or q.richer != out.answer or rules.proven(q.step) or not rules.fine(q.simpler):
                continue
            s = pool.slowdown(q.richer, q.simpler)
            if s is not None and s.pairs and s.estimate < 0 and decision.judge(s, tol) != decision.KEEP:
                slower.append((s.estimate, q, s))
        if not slower:
            return
        _, q, s = min(slower, key=lambda x: x[0])
        gone = [k for k in attribution_mod.changed(base, out.answer) if q.simpler.get(k) != out.answer.get(k)]
        out.dropped += [{"step": k, "value": out.answer.get(k), "slowdown": s.to_json(), "reason": "measured_slower"}
                        for k in gone]
        out.answer = dict(q.simpler)
        _moved(out, events, tol, {"reason": "measured_slower", "steps": gone, "slowdown": s.to_json()})


def _no_slower_than_the_baseline(out: Finished, pool: Pool, rules: Rules, base: dict[str, Any],
                                 events: "SearchEvents | None") -> None:
    """At the end, an answer the rule has not shown faster than the baseline beyond the
    tolerance, and that measured slower than it (the paired estimate), gives way to the
    baseline: at the limit the richer side stays, but not past what the user runs now (on a
    very noisy machine a slower change can become the reference)."""
    if out.answer == base or not rules.fine(base):
        return
    s = pool.slowdown(out.answer, base)  # how much slower the baseline is than the answer (None: unmeasured)
    if s is None or s.estimate >= 0 or decision.judge(s, rules.tolerance) == decision.KEEP:
        return
    gone = attribution_mod.changed(base, out.answer)
    out.dropped += [{"step": k, "value": out.answer.get(k), "slowdown": s.to_json(), "reason": "baseline_stays"}
                    for k in gone]
    out.answer = dict(base)
    _moved(out, events, rules.tolerance, {"reason": "baseline_stays", "steps": gone, "slowdown": s.to_json()})


def _round(out: Finished, todo: list[Question], run: Run, pool: Pool, budget: Budget, agree: Agree) -> bool:
    """One interleaved round: the reference and each open question's other configuration, the
    widest intervals first (the reference first in even rounds, last in odd ones). False when
    the budget could not fit the next run."""
    others: dict[str, dict[str, Any]] = {}
    if out.answer != out.reference:
        others[key(out.answer)] = out.answer  # the answer's questions are asked against it too
    for q in sorted(todo, key=lambda q: -_width(pool, q)):
        for p in (q.richer, q.simpler):
            if p != out.reference:
                others.setdefault(key(p), p)
    order = [out.reference, *others.values()]
    if out.rounds % 2:
        order = [*others.values(), out.reference]
    order = agree(order)  # rank 0's plan: every rank measures the same configurations
    measured = 0
    for params in order:
        k = key(params)
        if not agree(budget.fits(k)):
            if measured:
                out.rounds += 1
            return False
        began = budget.clock()
        pool.add(run(dict(params)), "finish", ("finish", out.rounds))
        budget.durations.setdefault(k, []).append(budget.clock() - began)
        measured += 1
        out.runs += 1
    out.rounds += 1
    return True


def _width(pool: Pool, q: Question) -> float:
    s = pool.slowdown(q.richer, q.simpler)
    return s.half_log if s is not None else math.inf


def open_record(q: Question, pool: Pool, answer: Mapping[str, Any]) -> dict[str, Any]:
    """A question left open, as data: its ``kind`` and ``step``, the ``side`` it was asked of
    (after a drop, the answer or the reference), what the simpler side ``differs`` in (which
    finalist: ``{knob: [richer, simpler]}``), and its interval (``slowdown``; ``None``: none yet)."""
    s = pool.slowdown(q.richer, q.simpler)
    return {"kind": q.kind, "step": q.step, "side": "answer" if q.richer == answer else "reference",
            "differs": {k: [v, q.simpler.get(k)] for k, v in q.richer.items() if k in LEVERS and q.simpler.get(k) != v},
            "slowdown": s.to_json() if s is not None else None}


def _moved(out: Finished, events: "SearchEvents | None", tolerance: float, move: dict[str, Any]) -> None:
    """Record a move of the reference or the answer, and tell it (a detail: ``--explain``)."""
    out.moves.append(move)
    if events is not None:
        events.detail(Said("move", {**move, "tolerance": tolerance}))
