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
    from tuner.trial.result import TrialResult
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
    """The answer: the fastest finalist, or the one with the fewest changes among those
    within the noise of the fastest."""
    rounds: int = 0
    """Interleaved rounds measured."""
    equals: list[dict[str, Any]] = field(default_factory=list)
    """Finalists within the noise of the fastest (the winner among them)."""
    notes: list[str] = field(default_factory=list)


def changes(params: dict[str, Any], baseline: dict[str, Any]) -> int:
    """Knobs set differently from the baseline (what follows from them, accumulation and
    engine, is not a change of its own)."""
    return sum(params.get(k) != baseline.get(k) for k in KNOBS)


def confirm(finalists: list[dict[str, Any]], baseline: dict[str, Any], cap: int, run: Run, pool: Pool,
            agree: Agree, events: "SearchEvents | None") -> Confirmation | None:
    """The finalists, interleaved, one round at a time, until the fastest is apart from every
    other finalist beyond the noise, or those left are equals (:func:`_equals`), or ``cap``
    rounds. Runs already in the pool (the search trials) count: a finalist already apart
    from the fastest is not re-measured, nor is the baseline when the fastest is already
    apart from it (its speedup stands on the noise alone); a finalist left behind beyond
    the noise is dropped."""
    if cap < 1 or not finalists:
        return None
    base = Config(**baseline)
    contenders = _within_reach([Config(**p) for p in finalists], pool)
    contenders, with_base = agree((contenders, base not in contenders and
                                   not pool.apart(contenders[0].params(), baseline)))
    if events:
        joined = " (the baseline in the first round)" if with_base else ""
        events.note(f"confirming: {len(contenders)} finalist(s), interleaved{joined}, until the fastest is apart "
                    f"beyond the noise (at most {cap} round(s))")
    rounds = 0
    while rounds < cap:
        # the baseline joins the first round only: the speedup's second sample, measured in
        # the same minutes as the finalists; the ranking that goes on is the finalists'
        for config in dict.fromkeys([base, *contenders] if rounds == 0 and with_base else contenders):
            if config != base and agree(_left_behind(config, contenders, pool)):
                continue
            pool.add(run(config), "confirmation")
        rounds += 1
        ranked = sorted((c for c in contenders if pool.rates(c.params())),
                        key=lambda c: pool.median(c.params()) or 0.0, reverse=True)
        if not ranked:
            return None
        contenders = agree(_within_reach(ranked, pool))
        if len(contenders) == 1 or agree(_equals(contenders, pool)):
            break
    return _answer(contenders, baseline, pool, rounds)


def _left_behind(config: Config, contenders: list[Config], pool: Pool) -> bool:
    """Whether a finalist is already apart below the fastest so far, with the noise known
    (the runs earlier in this round taught it): then this round need not measure it. On
    the benchmark's DeepSpeed job ZeRO 1, 20% below the fastest's search trial, was still
    within the 10% a run assumed before any repeat, and measured again after the first two
    finalists' repeats had shown ±3%."""
    if pool.known_noise() is None or config == contenders[0] or not pool.rates(config.params()):
        return False
    fastest = max(contenders, key=lambda c: pool.median(c.params()) or 0.0)
    return fastest != config and pool.apart(fastest.params(), config.params())


def _equals(contenders: list[Config], pool: Pool) -> bool:
    """Whether the finalists still in the race are within one standard error of the fastest
    (half the margin that would call them apart), each measured at least twice with the
    noise known: another round is then as likely to swap them as to separate them, so they
    are equals and the simplest wins. Seen on the benchmark's DeepSpeed job: micro-batch
    64 and 128 within 0.4% of each other after their search trials ran all 3 rounds (7
    runs, 10 s of a 28 s search) to end "within the noise" anyway."""
    if pool.known_noise() is None or any(len(pool.rates(c.params())) < 2 for c in contenders):
        return False
    lead = contenders[0].params()
    gaps = [pool.gap(lead, c.params()) for c in contenders[1:]]
    return all(g is not None and abs(g[0]) <= g[1] / 2 for g in gaps)


def _within_reach(ranked: list[Config], pool: Pool) -> list[Config]:
    """The fastest, and the others it is not apart from beyond the noise."""
    lead = ranked[0].params()
    return [ranked[0]] + [c for c in ranked[1:] if not pool.apart(lead, c.params())]


def _answer(contenders: list[Config], baseline: dict[str, Any], pool: Pool, rounds: int) -> Confirmation:
    """The winner: among finalists within the noise of the fastest, the fewest changes."""
    equals = [c.params() for c in contenders]
    fastest = equals[0]
    winner = min(equals, key=lambda p: (changes(p, baseline), -(pool.median(p) or 0.0)))
    noise = pool.noise()
    out = Confirmation(winner=winner, rounds=rounds, equals=equals)
    if len(equals) == 1:
        out.notes.append(f"confirmation: the fastest finalist is apart from the others beyond the noise "
                         f"(±{noise:.0%} a run) after {rounds} round(s)")
    else:
        out.notes.append(f"confirmation: {len(equals)} finalists within the noise of the fastest after {rounds} "
                         f"round(s) (±{noise:.0%} a run)")
    if winner != fastest:
        slower = 1 - (pool.median(winner) or 0.0) / (pool.median(fastest) or 1.0)
        out.notes.append(f"recommending the simplest of equals: {changes(winner, baseline)} change(s) from the "
                         f"baseline instead of {changes(fastest, baseline)}, {slower:.1%} slower, within the noise")
    return out


def attribute(base: dict[str, Any], best: dict[str, Any], repeats: int, run: Run, pool: Pool,
              make: Callable[[dict[str, Any]], Config], events: "SearchEvents | None") -> Attribution | None:
    """Every configuration on the baseline-to-best path and every leave-one-out: those the
    pool does not already know measured ``repeats`` times, interleaved; the table from the
    pool, so each configuration has one median everywhere."""
    points = [c for _, c in [*attribution_mod.path(base, best), *attribution_mod.leave_one_out(base, best)]]
    configs = {attribution_mod.key(c): make({n: c[n] for n in attribution_mod.ORDER if n in c}) for c in points}
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
    failures: dict[str, str] = {}
    for round_ in range(max(need.values(), default=0)):
        for k, config in configs.items():
            if round_ < need[k] and k not in failures:
                result = run(config)
                pool.add(result, "attribution")
                if not result.ok:
                    failures[k] = f"{result.state}: {result.reason}"
    batch_norm = any("BatchNorm" in n for e in pool.entries.values() for r in e.runs for n in r.notes)
    rates = {k: pool.rates(c.params()) for k, c in configs.items()}
    return attribution_mod.attribute(base, best, rates, failures, batch_norm)
