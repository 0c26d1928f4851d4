"""The end of a search: the finalists re-measured against the baseline until the ranking is
clear, and the gain attributed knob by knob, every configuration interleaved with the others
(the same minutes, the same noise for all). Every measurement goes into the run's
:class:`~tuner.tuning.pool.Pool`, and nothing already known is measured again: measured on
the issue's DeepSpeed job before pooling, a one-knob answer cost 12 confirmation runs and 6
attribution runs, the attribution re-measuring the two configurations the confirmation had
just measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from tuner.analysis import attribution as attribution_mod
from tuner.analysis.attribution import Attribution
from tuner.config.space import KNOBS, Config
from tuner.tuning.pool import Pool

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

Run = Callable[[Config], "TrialResult"]
"""Measures one configuration (a trial in this process, or a script trial)."""
Agree = Callable[[Any], Any]
"""Rank 0's value on every rank (:func:`tuner.harness.distributed.broadcast`)."""


@dataclass
class Confirmation:
    winner: dict[str, Any]
    """The answer: the fastest finalist by median, or a finalist with fewer changes whose
    slowdown against it is below the tolerance with 95% confidence."""
    fastest: dict[str, Any] | None = None
    """The fastest finalist by median: what every later "simpler" is compared with."""
    rounds: int = 0
    """Interleaved rounds measured."""
    equals: list[dict[str, Any]] = field(default_factory=list)
    """Simpler finalists shown within the tolerance of the fastest (the winner among them)."""
    rule: str = "fastest"
    """What decided: ``fastest`` (every other finalist decided against, the fastest kept),
    ``equivalent`` (a simpler one shown within the tolerance), ``cap`` (rounds ran out
    undecided: the fastest median)."""
    notes: list[str] = field(default_factory=list)


def changes(params: dict[str, Any], baseline: dict[str, Any]) -> int:
    """Knobs set differently from the baseline (what follows from them, accumulation and
    engine, is not a change of its own)."""
    return sum(params.get(k) != baseline.get(k) for k in KNOBS)


def confirm(finalists: list[dict[str, Any]], baseline: dict[str, Any], cap: int, run: Run, pool: Pool,
            agree: Agree, events: "SearchEvents | None", tolerance: float = 0.02) -> Confirmation | None:
    """The finalists, interleaved, one round at a time, until every one of them is decided
    against the fastest median (:func:`_decided`) or ``cap`` rounds. Runs already in the
    pool (the search trials) count: the baseline is not re-measured when the fastest is
    already apart from it (its speedup stands on the noise alone); a finalist decided is
    not measured again, and one that cannot win is dropped."""
    if cap < 1 or not finalists:
        return None
    base = Config(**baseline)
    contenders = _open(_ranked([Config(**p) for p in finalists], pool), baseline, pool, tolerance)
    contenders, with_base = agree((contenders, base not in contenders and
                                   not pool.apart(contenders[0].params(), baseline)))
    if events:
        joined = " (the baseline in the first round)" if with_base else ""
        events.note(f"confirming: {len(contenders)} finalist(s), interleaved{joined}, until each is decided "
                    f"against the fastest at a {tolerance:.0%} tolerance (at most {cap} round(s))")
    rounds = 0
    while rounds < cap:
        fastest = contenders[0]
        for config in dict.fromkeys([base, *contenders] if rounds == 0 and with_base else contenders):
            if config not in (base, fastest) and agree(_decided(config, fastest, baseline, pool, tolerance)):
                continue
            pool.add(run(config), "confirmation")
        rounds += 1
        ranked = [c for c in _ranked(contenders, pool) if pool.rates(c.params())]
        if not ranked:
            return None
        contenders = agree(_open(ranked, baseline, pool, tolerance))
        if all(agree(_decided(c, contenders[0], baseline, pool, tolerance)) for c in contenders[1:]):
            break
    return _answer(contenders, baseline, pool, rounds, cap, tolerance)


def _ranked(configs: list[Config], pool: Pool) -> list[Config]:
    """Fastest median first; those with no successful run yet after them, in their order."""
    return sorted(configs, key=lambda c: -(pool.median(c.params()) or 0.0))


def _simpler(config: Config, than: Config, baseline: dict[str, Any]) -> bool:
    return changes(config.params(), baseline) < changes(than.params(), baseline)


def _decided(config: Config, fastest: Config, baseline: dict[str, Any], pool: Pool, tolerance: float) -> bool:
    """Whether more runs could not change ``config``'s verdict against the fastest: a
    simpler finalist is within the tolerance or beyond it, with 95% confidence; another is
    slower beyond the noise, or the fastest costs less than the tolerance against it."""
    s = pool.slowdown(fastest.params(), config.params())
    if s is None:
        return False
    if _simpler(config, fastest, baseline):
        return s.decided(tolerance)
    return s.low > -tolerance


def _open(ranked: list[Config], baseline: dict[str, Any], pool: Pool, tolerance: float) -> list[Config]:
    """The fastest, and the finalists that may still be the answer: a simpler one not shown
    slower than the fastest by more than the tolerance, another not shown slower at all."""
    lead = ranked[0]
    out = [lead]
    for c in ranked[1:]:
        s = pool.slowdown(lead.params(), c.params())
        if _simpler(c, lead, baseline):
            if s is None or not s.beyond(tolerance):
                out.append(c)
        elif not pool.apart(lead.params(), c.params()):
            out.append(c)
    return out


def _answer(contenders: list[Config], baseline: dict[str, Any], pool: Pool, rounds: int, cap: int,
            tolerance: float) -> Confirmation:
    """The fastest median, or the fewest changes among the finalists shown within the
    tolerance of it (ties: the faster median)."""
    fastest = contenders[0]
    shown = {c: s for c in contenders[1:] if _simpler(c, fastest, baseline)
             and (s := pool.slowdown(fastest.params(), c.params())) is not None and s.within(tolerance)}
    winner = min([fastest, *shown], key=lambda c: (changes(c.params(), baseline), -(pool.median(c.params()) or 0.0)))
    undecided = [c for c in contenders[1:] if not _decided(c, fastest, baseline, pool, tolerance)]
    rule = "equivalent" if winner != fastest else ("cap" if undecided else "fastest")
    out = Confirmation(winner=winner.params(), fastest=fastest.params(), rounds=rounds,
                       equals=[c.params() for c in shown], rule=rule)
    if winner != fastest:
        out.notes.append(
            f"confirmation: recommending a simpler finalist, {changes(winner.params(), baseline)} change(s) from the "
            f"baseline instead of {changes(fastest.params(), baseline)}: {shown[winner].text()} against the "
            f"fastest, below the {tolerance:.0%} tolerance")
    elif undecided:
        out.notes.append(
            f"confirmation: after {rounds} round(s) (the cap, --confirm {cap}) {len(undecided)} finalist(s) still "
            f"undecided against the fastest at a {tolerance:.0%} tolerance: the fastest median is kept")
    else:
        out.notes.append(f"confirmation: the fastest finalist is kept after {rounds} round(s): no simpler one is "
                         f"within {tolerance:.0%} of it with 95% confidence")
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


def settle(answer: dict[str, Any], fastest: dict[str, Any], simpler: list[Config], cap: int, run: Run,
           pool: Pool, agree: Agree, events: "SearchEvents | None", tolerance: float) -> int:
    """The answer against each simpler configuration the attribution measured (the answer
    with one change put back) whose verdict is still open: interleaved rounds until each is
    within or beyond the tolerance against the fastest, or ``cap`` rounds. A change the
    attribution read as worth less than the tolerance, a loss among them, is thereby kept
    only on evidence (seen before: bf16 kept at 0.90x going forward, +10% leaving it out,
    on a held-out DeepSpeed job). Returns the rounds measured."""
    def open_(c: Config) -> bool:
        s = pool.slowdown(fastest, c.params())
        if s is None:
            return bool(pool.rates(c.params())) and not pool.entry(c.params()).failures
        return not s.decided(tolerance) and s.estimate < tolerance and not pool.entry(c.params()).failures

    todo = agree([c for c in simpler if open_(c)])
    if not todo or cap < 1:
        return 0
    if events:
        events.note(f"settling {len(todo)} change(s) the attribution could not decide at a {tolerance:.0%} "
                    f"tolerance: the answer with each put back, interleaved (at most {cap} round(s))")
    rounds = 0
    while todo and rounds < cap:
        for config in dict.fromkeys([Config(**answer), Config(**fastest), *todo]):
            pool.add(run(config), "confirmation")
        rounds += 1
        todo = agree([c for c in todo if open_(c)])
    return rounds
