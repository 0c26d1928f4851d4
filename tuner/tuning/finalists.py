"""The end of a search: the finalists re-measured against each other until the one rule
(:mod:`tuner.stats.decision`) settles each pair, and the gain attributed knob by knob,
every configuration interleaved with the others (the same minutes, the same noise for all).
Every measurement goes into the run's :class:`~tuner.tuning.pool.Pool`, and nothing
already known is measured again: measured on the issue's DeepSpeed job before pooling, a
one-knob answer cost 12 confirmation runs and 6 attribution runs, the attribution
re-measuring the two configurations the confirmation had just measured.

What is measured more is bounded by a :class:`Limit`: ``--confirm`` rounds per decision
(default :data:`CAP_ROUNDS`) and, for the whole finish, :data:`TIME_SHARE` of the time the
search itself took (at least :data:`MIN_ROUNDS` rounds). A decision still open there is
``undecided`` and the faster-measured configuration stays.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from tuner.analysis import attribution as attribution_mod
from tuner.analysis.attribution import Attribution
from tuner.config.space import KNOBS, Config
from tuner.stats import decision
from tuner.stats.interval import slowdown
from tuner.tuning.pool import Pool, key

if TYPE_CHECKING:
    from tuner.trial.trial_result import TrialResult
    from tuner.tuning.events import SearchEvents

FINALISTS = 3
"""Configurations re-measured in the confirmation: one noisy search trial must not pick
the winner (seen on the benchmark: the true best was found, then outrun by a lucky
measurement of a configuration 20% slower)."""
KNOWN = 2
"""Runs of a configuration already in the pool that make it known to the attribution
(the confirmation measured it until the ranking was clear). The two ends, baseline and
best, are known with one run each when they are apart beyond the noise: the gain between
them is then what the noise cannot make."""
CAP_ROUNDS = 100
"""Interleaved rounds one decision may take (``--confirm``): enough for the rule to decide
a real 5% loss against a 2% tolerance at 10% noise a run 99% of the time (37 runs on
average, 93 at the 95th percentile;
``tests/analysis/test_operating_characteristics.py``). The time share usually comes first."""
TIME_SHARE = 0.5
"""The finish (confirmation, attribution, the changes settled) measures for at most this
share of the time the search's trials took before it."""
MIN_ROUNDS = 3
"""Rounds a decision may always take, whatever the time share says."""

Run = Callable[[Config], "TrialResult"]
"""Measures one configuration (a trial in this process, or a script trial)."""
Agree = Callable[[Any], Any]
"""Rank 0's value on every rank (:func:`tuner.harness.distributed.broadcast`)."""


@dataclass
class Limit:
    """How much more the finish may measure: rounds per decision, seconds in all."""

    rounds: int = CAP_ROUNDS
    seconds: float | None = None
    """The finish's time share (``None``: no time limit)."""
    started: float = field(default_factory=time.monotonic)

    def reached(self, rounds: int) -> bool:
        """Whether a decision that has measured ``rounds`` rounds must stop (rank 0's clock:
        callers agree on it)."""
        if rounds >= self.rounds:
            return True
        return (self.seconds is not None and rounds >= MIN_ROUNDS
                and time.monotonic() - self.started > self.seconds)


Pair = tuple[Mapping[str, Any], Mapping[str, Any]]
"""(richer, simpler): the configuration with a change, and without it."""


def settle(pairs: Sequence[Pair], measure: Callable[[Mapping[str, Any]], None], pool: Pool, tolerance: float,
           limit: Limit, agree: Agree = lambda x: x) -> int:
    """Interleaved rounds until every pair is settled (:func:`tuner.stats.decision.settled`:
    decided, or precise) or the limit. Each round measures every configuration of the open
    pairs once (one run of a configuration shared by several pairs serves them all); a
    pair is looked at on the schedule of :data:`tuner.stats.decision.LOOKS`, by the
    fewer of its two configurations' runs. A pair whose configuration fails is closed: it
    cannot be decided. Returns the rounds measured."""
    keys = [(key(a), key(b)) for a, b in pairs]
    members = {k: p for pair, ks in zip(pairs, keys) for k, p in zip(ks, pair)}
    looks: dict[int, int] = {}
    still: list[int] = []
    for i, (ka, kb) in enumerate(keys):
        looks[i] = decision.next_look(_runs(pool, ka, kb))
        if not _closed(pool, ka, kb, tolerance):
            still.append(i)
    open_ = agree(still)
    rounds = 0
    while open_ and not agree(limit.reached(rounds)):
        for k in dict.fromkeys(k for i in open_ for k in keys[i]):
            measure(members[k])
        rounds += 1
        still = []
        for i in open_:
            ka, kb = keys[i]
            if pool.by_key(ka).failures or pool.by_key(kb).failures:
                continue
            n = _runs(pool, ka, kb)
            if n >= looks[i]:
                looks[i] = decision.next_look(n)
                if _closed(pool, ka, kb, tolerance):
                    continue
            still.append(i)
        open_ = agree(still)
    return rounds


def _runs(pool: Pool, ka: str, kb: str) -> int:
    return min(len(pool.by_key(ka).rates), len(pool.by_key(kb).rates))


ANSWER_RUNS = 2
"""Runs of its own a configuration needs before a decision makes it the answer. The pooled
noise can decide a drop from one run of the simpler configuration (seen: the answer
without two cheap changes, together, recommended on its one search trial, "median of 1
run"); the method verifies an answer with repeated runs, so such a pair stays open a round."""


def _closed(pool: Pool, ka: str, kb: str, tolerance: float) -> bool:
    """Whether a pair (richer, simpler) needs no more runs: a failure, or the rule settled,
    and the simpler side measured :data:`ANSWER_RUNS` times if it is the one adopted."""
    a, b = pool.by_key(ka), pool.by_key(kb)
    if a.failures or b.failures:
        return True
    s = slowdown(a.stats, b.stats, pool.spread())
    if not decision.settled(s, tolerance):
        return False
    return len(b.rates) >= ANSWER_RUNS or decision.call(s, tolerance).verdict != decision.DROP


@dataclass
class Confirmation:
    winner: dict[str, Any]
    """The answer: the fastest finalist, or a finalist with fewer changes shown to cost it
    less than the tolerance."""
    fastest: dict[str, Any] | None = None
    """The fastest finalist: what every later "simpler" is compared with."""
    rounds: int = 0
    """Interleaved rounds measured."""
    equals: list[dict[str, Any]] = field(default_factory=list)
    """Simpler finalists shown within the tolerance of the fastest (the winner among them)."""
    rule: str = "fastest"
    """What decided: ``fastest`` (every other finalist decided, the fastest kept),
    ``equivalent`` (a simpler one shown within the tolerance), ``cap`` (the limit came
    with some undecided: the fastest stays)."""
    notes: list[str] = field(default_factory=list)


def changes(params: Mapping[str, Any], baseline: Mapping[str, Any]) -> int:
    """Knobs set differently from the baseline (what follows from them, accumulation and
    engine, is not a change of its own)."""
    return sum(params.get(k) != baseline.get(k) for k in KNOBS)


def _simpler(config: Mapping[str, Any], than: Mapping[str, Any], baseline: Mapping[str, Any]) -> bool:
    return changes(config, baseline) < changes(than, baseline)


def _pair(fastest: Mapping[str, Any], other: Mapping[str, Any], baseline: Mapping[str, Any]) -> Pair:
    """The decision between the fastest and another finalist, as (richer, simpler): a
    finalist with fewer changes is the simpler; otherwise the fastest is what the other
    must beat by more than the tolerance."""
    return (fastest, other) if _simpler(other, fastest, baseline) else (other, fastest)


def _geomean(pool: Pool, params: Mapping[str, Any]) -> float:
    stats = pool.entry(params).stats
    return stats.mean if stats.n else float("-inf")


def confirm(finalists: list[dict[str, Any]], baseline: dict[str, Any], limit: Limit, run: Run, pool: Pool,
            agree: Agree, events: "SearchEvents | None", tolerance: float = 0.02) -> Confirmation | None:
    """The finalists, interleaved, one round at a time, until every other finalist is
    settled against the fastest (the one rule, looked at on its schedule) or the limit.
    Runs already in the pool (the search trials) count; the baseline joins the first round
    (the speedup, and the regression gate's record of it, stand on two runs of each end); a
    finalist settled is not measured again."""
    if limit.rounds < 1 or not finalists:
        return None
    contenders = [dict(Config(**p).params()) for p in finalists]
    contenders.sort(key=lambda p: -_geomean(pool, p))
    with_base = baseline not in contenders
    if events:
        joined = " (the baseline in the first round)" if with_base else ""
        events.note(f"confirming: {len(contenders)} finalist(s), interleaved{joined}, until each is settled against "
                    f"the fastest at a {tolerance:.0%} tolerance (at most {limit.rounds} round(s))")
    settled: dict[str, bool] = {}
    looks: dict[str, int] = {}

    def open_ones() -> list[dict[str, Any]]:
        fastest = contenders[0]
        out = []
        for c in contenders[1:]:
            ka, kb = (key(p) for p in _pair(fastest, c, baseline))
            pair_key = ka + "|" + kb
            n = _runs(pool, ka, kb)
            if pair_key not in looks or n >= looks[pair_key]:
                looks[pair_key] = decision.next_look(n)
                settled[pair_key] = _closed(pool, ka, kb, tolerance)
            if not settled[pair_key]:
                out.append(c)
        return out

    still = agree(open_ones())
    rounds = 0
    while (still or (rounds == 0 and with_base)) and not agree(limit.reached(rounds)):
        todo = [baseline] if rounds == 0 and with_base else []
        for params in {key(p): p for p in [*todo, contenders[0], *still]}.values():
            pool.add(run(Config(**params)), "confirmation")
        rounds += 1
        ranked = [c for c in contenders if pool.rates(c)]
        if not ranked:
            return None
        contenders = agree(sorted(ranked, key=lambda p: -_geomean(pool, p)))
        still = agree(open_ones())
    return _answer(contenders, baseline, pool, rounds, limit, tolerance, bool(still))


def _answer(contenders: list[dict[str, Any]], baseline: dict[str, Any], pool: Pool, rounds: int, limit: Limit,
            tolerance: float, undecided: bool) -> Confirmation:
    """The fastest, or the fewest changes among the simpler finalists the rule drops to
    (shown within the tolerance of the fastest; ties: the faster)."""
    fastest = contenders[0]
    shown = {key(c): c for c in contenders[1:] if _simpler(c, fastest, baseline)
             and decision.judge(pool.slowdown(fastest, c), tolerance) == decision.DROP}
    winner = min([fastest, *shown.values()], key=lambda c: (changes(c, baseline), -_geomean(pool, c)))
    rule = "equivalent" if winner != fastest else ("cap" if undecided else "fastest")
    out = Confirmation(winner=dict(winner), fastest=dict(fastest), rounds=rounds,
                       equals=[dict(c) for c in shown.values()], rule=rule)
    if winner != fastest:
        s = pool.slowdown(fastest, winner)
        assert s is not None
        out.notes.append(
            f"confirmation: recommending a simpler finalist, {changes(winner, baseline)} change(s) from the "
            f"baseline instead of {changes(fastest, baseline)}: {s.text()} against the fastest, below the "
            f"{tolerance:.0%} tolerance")
    elif undecided:
        out.notes.append(
            f"confirmation: after {rounds} round(s) (the limit: at most {limit.rounds} round(s) and the finish's "
            f"share of the time) some finalists are undecided against the fastest at a {tolerance:.0%} "
            "tolerance: the fastest stays")
    else:
        out.notes.append(f"confirmation: the fastest finalist is kept after {rounds} round(s): every other one is "
                         f"settled against it at a {tolerance:.0%} tolerance")
    return out


def attribute(base: dict[str, Any], best: dict[str, Any], repeats: int, run: Run, pool: Pool,
              make: Callable[[dict[str, Any]], Config], events: "SearchEvents | None",
              tolerance: float = 0.02, valid: "attribution_mod.Valid | None" = None) -> Attribution | None:
    """Every configuration on the baseline-to-best path and every leave-one-out: those the
    pool does not already know measured ``repeats`` times, interleaved; the table from the
    pool, so each configuration has one median everywhere."""
    configs = _attribution_configs(base, best, make, valid)
    if len(configs) < 2:
        return None
    ends = pool.apart(best, base)  # False unless both ends have runs
    need = {k: (repeats if not pool.entry(c.params()).runs else
                0 if ends and c.params() in (base, best) else
                max(0, KNOWN - len(pool.rates(c.params()))))
            for k, c in configs.items()}
    if events:
        todo = sum(n > 0 for n in need.values())
        events.note(f"attributing the gain: {len(configs)} configurations, {len(configs) - todo} already measured, "
                    f"{todo} to measure (interleaved, {repeats} time(s) each)")
    failed: set[str] = set()
    for round_ in range(max(need.values(), default=0)):
        for k, config in configs.items():
            if round_ < need[k] and k not in failed:
                result = run(config)
                pool.add(result, "attribution")
                if not result.ok:
                    failed.add(k)
    return table(base, best, pool, make, tolerance, valid)


def _attribution_configs(base: dict[str, Any], best: dict[str, Any], make: Callable[[dict[str, Any]], Config],
                         valid: "attribution_mod.Valid | None" = None) -> dict[str, Config]:
    """Every configuration on the baseline-to-best path and every leave-one-out, by key."""
    points = [c for _, c in [*attribution_mod.path(base, best, valid),
                             *attribution_mod.leave_one_out(base, best, valid)]]
    return {attribution_mod.key(c): make({n: c[n] for n in attribution_mod.ORDER if n in c}) for c in points}


def table(base: dict[str, Any], best: dict[str, Any], pool: Pool, make: Callable[[dict[str, Any]], Config],
          tolerance: float, valid: "attribution_mod.Valid | None" = None) -> Attribution:
    """The attribution table from what the pool holds (one median per configuration)."""
    configs = _attribution_configs(base, best, make, valid)
    failures = {k: why for k, c in configs.items()
                if (why := next((f"{r.state}: {r.reason}" for r in pool.entry(c.params()).runs if not r.ok), None))}
    batch_norm = any("BatchNorm" in n for e in pool.entries.values() for r in e.runs for n in r.notes)
    rates = {k: pool.rates(c.params()) for k, c in configs.items()}
    return attribution_mod.attribute(base, best, rates, failures, batch_norm, tolerance, pool.spread(), valid)


def settle_changes(fastest: dict[str, Any], simpler: list[Config], limit: Limit, run: Run, pool: Pool,
                   agree: Agree, events: "SearchEvents | None", tolerance: float) -> int:
    """The fastest against each simpler configuration the attribution measured (the answer
    with one change put back) whose decision is still open: interleaved rounds until each
    is settled or the limit (:func:`settle`). A change is thereby dropped only on
    evidence, and kept past the cap only undecided (seen before this rule: bf16 kept at
    0.90x going forward, +10% leaving it out, on a held-out DeepSpeed job). Returns the
    rounds measured."""
    pairs = [(fastest, c.params()) for c in simpler if pool.rates(c.params())]
    todo = agree(sum(not _closed(pool, key(a), key(b), tolerance) for a, b in pairs))
    if not todo or limit.rounds < 1:
        return 0
    if events:
        events.note(f"settling {todo} change(s) the attribution could not decide at a {tolerance:.0%} tolerance: "
                    f"the answer with each put back, interleaved (at most {limit.rounds} round(s))")
    return settle(pairs, lambda p: pool.add(run(Config(**p)), "confirmation"), pool, tolerance, limit, agree)


def time_share(durations: Sequence[float]) -> float | None:
    """The finish's time limit from the search's trial durations (``None``: none measured)."""
    return TIME_SHARE * sum(durations) if durations else None
