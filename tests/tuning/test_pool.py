"""The end of a search decides from pooled measurements: when to stop confirming, what the
attribution still has to measure, which of equals to recommend.

The decisions are pure functions of the rates measured, so these tests feed them rates of
known configurations (a scripted ``run``); the real trials behind them are exercised end
to end in test_search.py.
"""

from __future__ import annotations

import itertools

from tuner.config.space import Config, Machine, make_config
from tuner.trial.trial_result import State, TrialResult
from tuner.tuning.finalists import Limit, attribute, confirm, settle_changes
from tuner.tuning.pool import NOISE_UNKNOWN, Pool

CPU = Machine(cuda=False, bf16=True, fp16=False)
JITTER = (1.0, 1.02, 0.98, 1.01, 0.99)
"""One run's noise ~1.6% (relative standard deviation)."""
QUIET = (1.0, 1.001, 0.999, 1.0005, 0.9995)
"""~0.08%: a host wait that costs the same every step."""


def config(**knobs) -> Config:
    return make_config({"num_workers": 0, "micro_batch_size": 8, **knobs}, 16, 1, CPU, "auto")[0]


def result(c: Config, rate: float, state: State = State.OK) -> TrialResult:
    metrics = {"samples_per_s": rate} if state == State.OK else None
    return TrialResult(c.params(), state, None if state == State.OK else "boom", metrics)


class Scripted:
    """Measures each configuration at its true rate times a small repeating jitter."""

    def __init__(self, truth: dict[Config, float], jitter: tuple[float, ...] = JITTER) -> None:
        self.truth, self.calls = truth, []
        self.jitter = {c: itertools.cycle(jitter) for c in truth}

    def __call__(self, c: Config) -> TrialResult:
        self.calls.append(c)
        return result(c, self.truth[c] * next(self.jitter[c]))


BASE, TWO, FOUR, FOUR_BIG = config(), config(num_workers=2), config(num_workers=4), config(num_workers=4,
                                                                                             micro_batch_size=16)


def test_noise_is_pooled_over_repeated_configurations_with_no_floor():
    pool = Pool()
    assert pool.known_noise() is None and pool.noise() == NOISE_UNKNOWN
    for rate in (100, 110, 90):
        pool.add(result(BASE, rate), "search")
    pool.add(result(TWO, 200), "search")  # measured once: no say in the noise
    assert 0.09 < pool.noise() < 0.11
    assert pool.spread()[1] == 2  # honest degrees of freedom: 3 runs of one configuration
    same = Pool()
    for _ in range(3):
        same.add(result(BASE, 100), "search")
    assert same.noise() == 0.0


def test_a_pruned_trial_is_not_a_measurement():
    pool = Pool()
    cut = result(BASE, 10)
    cut.pruned_at = (3, 10.0)
    pool.add(cut, "search")
    assert pool.rates(BASE.params()) == []


def test_confirmation_stops_after_one_round_when_the_best_is_clearly_apart():
    run = Scripted({BASE: 100, TWO: 300, FOUR: 200})
    pool = Pool()
    for c in (BASE, TWO, FOUR):  # the search trials
        pool.add(run(c), "search")
    run.calls.clear()
    out = confirm([TWO.params(), FOUR.params()], BASE.params(), Limit(5), run, pool, lambda x: x, None)
    assert out is not None and out.rounds == 1 and out.winner == TWO.params()
    # one round, not 5: the baseline joins it (the speedup stands on two runs of each end),
    # and FOUR, a third slower, is settled at its first look with a noise measured
    assert run.calls == [BASE, TWO, FOUR]
    assert out.rule == "fastest" and "fastest finalist is kept" in out.notes[0]
    assert pool.source(TWO.params()) == "median of 2 runs (1 search trial, 1 confirmation)"


def test_a_finalist_is_never_settled_on_an_assumed_noise():
    """Before any repeat there is no interval: a finalist far behind on its search trial is
    measured once more, until a look can decide it on a measured noise."""
    run = Scripted({BASE: 100, TWO: 125, FOUR: 120, FOUR_BIG: 40})
    pool = Pool()
    for c in (BASE, TWO, FOUR, FOUR_BIG):
        pool.add(run(c), "search")
    run.calls.clear()
    confirm([TWO.params(), FOUR.params(), FOUR_BIG.params()], BASE.params(), Limit(1), run, pool, lambda x: x, None)
    assert run.calls == [BASE, TWO, FOUR, FOUR_BIG]


def test_the_ends_of_an_attribution_apart_beyond_the_noise_need_one_run_each():
    run = Scripted({BASE: 100, FOUR: 300})
    pool = Pool()
    for c in (BASE, FOUR):
        pool.add(run(c), "search")
    run.calls.clear()
    table = attribute(BASE.params(), FOUR.params(), 3, run, pool, make, None)
    assert run.calls == [] and table is not None and table.best == 300
    assert table.rows[0].mark is None  # no repeat anywhere: no interval, no verdict


def test_a_simpler_finalist_shown_within_the_tolerance_is_recommended_before_the_cap():
    """0.5% apart on a quiet machine: after three runs each the upper 95% bound of the
    simpler one's slowdown is below 2%, so the cap (5) is not reached."""
    run = Scripted({BASE: 100, FOUR: 200, FOUR_BIG: 201}, QUIET)
    pool = Pool()
    out = confirm([FOUR_BIG.params(), FOUR.params()], BASE.params(), Limit(5), run, pool, lambda x: x, None, 0.02)
    assert out is not None and out.rounds < 5 and out.rule == "equivalent"
    assert out.winner == FOUR.params() and out.fastest == FOUR_BIG.params()  # one change, not two
    assert run.calls.count(BASE) == 1  # the baseline joins the first round only
    assert "below the 2% tolerance" in out.notes[0] and "99% interval" in out.notes[0]


def test_a_simpler_finalist_within_the_noise_but_not_shown_within_the_tolerance_loses_at_the_cap():
    """0.5% apart with runs 1.6% noisy: the interval stays wider than the tolerance through
    every round, so the fastest median is the answer, never the simpler one on a hunch."""
    run = Scripted({BASE: 100, FOUR: 200, FOUR_BIG: 201})
    pool = Pool()
    out = confirm([FOUR_BIG.params(), FOUR.params()], BASE.params(), Limit(3), run, pool, lambda x: x, None, 0.02)
    assert out is not None and out.rounds == 3 and out.rule == "cap"
    assert out.winner == FOUR_BIG.params()
    assert "undecided against the fastest" in out.notes[0] and "the fastest stays" in out.notes[0]


def test_a_gain_larger_than_the_tolerance_is_never_given_back_to_a_simpler_finalist():
    """3.8% apart (the old rule's floor let this one win every time): the simpler finalist is
    decided beyond the tolerance, or the cap keeps the fastest."""
    for jitter in (QUIET, JITTER):
        run = Scripted({BASE: 100, FOUR: 200, FOUR_BIG: 207.6}, jitter)
        out = confirm([FOUR_BIG.params(), FOUR.params()], BASE.params(), Limit(4), run, Pool(), lambda x: x, None,
                      0.02)
        assert out is not None and out.winner == FOUR_BIG.params(), jitter


def test_a_finalist_left_behind_is_no_longer_measured():
    run = Scripted({BASE: 100, TWO: 150, FOUR: 151, FOUR_BIG: 60}, QUIET)
    pool = Pool()
    out = confirm([FOUR.params(), TWO.params(), FOUR_BIG.params()], BASE.params(), Limit(3), run, pool, lambda x: x,
                  None, 0.02)
    assert run.calls.count(FOUR_BIG) == 2  # settled at its first look with a measured noise, then left
    # TWO and FOUR make one change each: once the fastest is shown to cost under 2% against
    # the other, more rounds cannot change the answer
    assert out is not None and out.rounds < 3 and out.winner == FOUR.params()


def test_finalists_undecided_go_on_to_the_cap():
    """4% apart with runs 1.6% noisy, the slower one simpler: neither within 2% nor beyond
    it with 95% confidence after any round."""
    run = Scripted({BASE: 100, TWO: 104, FOUR_BIG: 100})
    pool = Pool()
    out = confirm([FOUR_BIG.params(), TWO.params()], BASE.params(), Limit(3), run, pool, lambda x: x, None, 0.02)
    assert out is not None and out.rounds == 3 and run.calls.count(TWO) == 3


def confirmed_twice(run: Scripted, *configs: Config) -> Pool:
    """A pool where the confirmation measured ``configs`` twice each (the calls forgotten)."""
    pool = Pool()
    for _ in range(2):
        for c in configs:
            pool.add(run(c), "confirmation")
    run.calls.clear()
    return pool


def make(knobs) -> Config:
    return config(**knobs)


def test_attribution_of_one_changed_knob_measures_nothing_new():
    run = Scripted({BASE: 100, FOUR: 200})
    pool = confirmed_twice(run, BASE, FOUR)
    table = attribute(BASE.params(), FOUR.params(), 3, run, pool, make, None)
    assert run.calls == []
    assert table is not None and table.baseline == pool.median(BASE.params())
    assert table.best == pool.median(FOUR.params())


def test_attribution_measures_only_the_points_it_lacks():
    truth = {BASE: 100, FOUR: 150, config(micro_batch_size=16): 110, FOUR_BIG: 200}
    run = Scripted(truth)
    pool = confirmed_twice(run, BASE, FOUR_BIG)
    table = attribute(BASE.params(), FOUR_BIG.params(), 2, run, pool, make, None)
    # the path's middle point (workers only) doubles as the leave-one-out of micro_batch_size
    assert sorted(c.params()["num_workers"] * 100 + c.params()["micro_batch_size"] for c in run.calls) == \
        [16, 16, 408, 408]
    assert table is not None and [r.knob for r in table.rows] == ["num_workers", "micro_batch_size"]


def decide_for(best: Config, base: Config, pool: Pool, space, recipe, fastest: Config | None = None):
    from tuner.tuning.finalists import Confirmation, table
    from tuner.tuning.recommend import decide

    attribution = table(base.params(), best.params(), pool, make, recipe.tolerance)
    confirmed = Confirmation(winner=best.params(), fastest=(fastest or best).params())
    return decide(best.params(), confirmed, attribution, pool, base.params(), make, recipe, None, space)


def test_a_knob_left_out_of_the_answer_must_leave_a_point_of_the_space(toy):
    """The baseline has no workers, so its persistent_workers is the default false; the best
    runs 4 workers, persistent. That persistence costs nothing measurable (shown within 2%):
    the best without it is recommended where the space allows false, never where the
    recipe fixes it true."""
    import tuner
    from tuner.study.searchspace import Space

    base = config()
    best = config(num_workers=4, persistent_workers=True)
    without = config(num_workers=4, persistent_workers=False)
    run = Scripted({base: 100, best: 200, without: 199.8}, QUIET)
    pool = confirmed_twice(run, base, best, without)
    pool.add(run(best), "confirmation")
    pool.add(run(without), "confirmation")
    recipe = tuner.load_recipe(toy())
    choices = {k: (v,) for k, v in base.params().items() if k not in ("grad_accum_steps", "engine")}
    choices["num_workers"] = (0, 4)
    free = Space({**choices, "persistent_workers": (False, True)})
    fixed = Space({**choices, "persistent_workers": (True,)})
    picked = decide_for(best, base, pool, free, recipe)
    assert picked.params == without.params() and picked.rule == "leave-one-out"
    assert any("without persistent_workers" in n and "below the 2% tolerance" in n for n in picked.notes)
    kept = decide_for(best, base, pool, fixed, recipe)
    assert kept.params == best.params()
    assert fixed.holds(base.params(), 1)  # without workers persistent_workers means nothing


def test_each_change_kept_says_its_gain_and_interval_and_a_cheap_one_is_dropped(toy):
    """A task whose ranking is known: workers are worth 5% given the rest, a larger
    micro-batch 0%. The 5% is kept with its interval; the 0% goes."""
    import tuner
    from tuner.study.searchspace import Space

    base, best = config(), config(num_workers=4, micro_batch_size=16)
    no_workers, no_micro = config(micro_batch_size=16), config(num_workers=4)
    run = Scripted({base: 100, best: 200, no_workers: 200 / 1.05, no_micro: 200}, QUIET)
    pool = confirmed_twice(run, base, best, no_workers, no_micro)
    recipe = tuner.load_recipe(toy())
    choices = {k: (v,) for k, v in base.params().items() if k not in ("grad_accum_steps", "engine")}
    space = Space({**choices, "num_workers": (0, 4), "micro_batch_size": (8, 16)})
    got = decide_for(best, base, pool, space, recipe)
    assert got.params == no_micro.params() and got.rule == "leave-one-out"
    knobs = {k["knob"]: k for k in got.knobs}
    assert knobs["num_workers"]["kept"] and not knobs["micro_batch_size"]["kept"]
    assert 0.03 < knobs["num_workers"]["slowdown"]["low"] < 0.0477 < knobs["num_workers"]["slowdown"]["high"] < 0.07
    kept = "num_workers=4 kept: 4.8% faster than without it, 99% interval"
    assert any(n.startswith(kept) for n in got.notes), got.notes


def test_changes_the_attribution_left_open_are_settled_by_more_runs(toy):
    """A leave-one-out measured twice at 1.6% noise cannot be decided at 2%; settling measures
    the answer and it, interleaved, until it is (here: within), or the cap."""
    from tuner.stats import decision

    base, best, without = config(), config(num_workers=4, micro_batch_size=16), config(num_workers=4)
    run = Scripted({base: 100, best: 200, without: 200}, JITTER)
    pool = confirmed_twice(run, base, best, without)
    rounds = settle_changes(best.params(), [without], Limit(8), run, pool, lambda x: x, None, 0.02)
    s = pool.slowdown(best.params(), without.params())
    assert 0 < rounds <= 8 and (decision.settled(s, 0.02) or rounds == 8)
    assert run.calls.count(without) == rounds


def test_a_change_measured_as_a_loss_goes_only_once_the_interval_shows_it(toy):
    """The held-out DeepSpeed case: the answer's change read as a loss once the attribution
    had measured the answer without it (4% slower with it, at 1.6% noise). On two runs each
    the interval cannot tell, so the change stays, undecided (a point estimate is not
    evidence: a real 10% gain was given back 14% of the time at 22% noise that way); more
    runs, interleaved, show it, and then it goes."""
    import tuner
    from tuner.study.searchspace import Space

    base, best, without = config(), config(num_workers=4, micro_batch_size=16), config(micro_batch_size=16)
    run = Scripted({base: 100, best: 200, without: 208})
    pool = confirmed_twice(run, base, best, without)
    recipe = tuner.load_recipe(toy())
    choices = {k: (v,) for k, v in base.params().items() if k not in ("grad_accum_steps", "engine")}
    space = Space({**choices, "num_workers": (0, 4), "micro_batch_size": (8, 16)})
    got = decide_for(best, base, pool, space, recipe)
    workers = next(k for k in got.knobs if k["knob"] == "num_workers")
    assert got.params == best.params() and workers["label"] == "undecided", got.notes
    settle_changes(best.params(), [without], Limit(20), run, pool, lambda x: x, None, 0.02)
    got = decide_for(best, base, pool, space, recipe)
    assert got.params == without.params() and got.rule == "leave-one-out", got.notes
    workers = next(k for k in got.knobs if k["knob"] == "num_workers")
    assert workers["label"] == "dropped" and workers["text"].startswith("num_workers=4 dropped: without it")
    assert any(n.startswith("recommending the answer without num_workers: without it") for n in got.notes)


def test_changes_each_shown_cheap_are_dropped_together_only_when_together_they_are(toy):
    """Two changes each cost 1.5% alone (within 2%), 3% together (not): one goes, the
    cheaper; with the pair measured at 1% together, both go."""
    import tuner
    from tuner.study.searchspace import Space

    base = config()
    best = config(num_workers=4, micro_batch_size=16)
    no_w, no_m = config(micro_batch_size=16), config(num_workers=4)
    recipe = tuner.load_recipe(toy())
    choices = {k: (v,) for k, v in base.params().items() if k not in ("grad_accum_steps", "engine")}
    space = Space({**choices, "num_workers": (0, 4), "micro_batch_size": (8, 16)})
    for both, expect in ((200 * 0.97, [no_m.params(), no_w.params()]), (200 * 0.99, [base.params()])):
        run = Scripted({base: both, best: 200, no_w: 200 * 0.985, no_m: 200 * 0.986}, QUIET)
        pool = Pool()
        for _ in range(4):
            for c in (base, best, no_w, no_m):
                pool.add(run(c), "confirmation")
        got = decide_for(best, base, pool, space, recipe)
        assert got.params in expect, (both, got.notes)
        assert got.together is not None and got.together["dropped"] == (got.params == base.params())


def test_the_prune_bar_reads_the_noise_the_run_measured_and_the_window_it_measures():
    """The search's bar: no noise before any repeat (no cut), then the pooled noise with its
    degrees of freedom, the best's own runs, and the run's typical window for plateaus."""
    from tuner.config.recipe import Steps
    from tuner.study.record import Record, Status
    from tuner.tuning.budget import prune_rule

    pool = Pool()
    best = Record(number=0, id=0, status=Status.COMPLETE, value=100.0, attrs={"params": BASE.params()})
    pool.add(TrialResult(BASE.params(), State.OK, None, {"samples_per_s": 100.0, "measured_steps": 18,
                                                         "warmup_set_aside": 2}), "search")
    bar = prune_rule(best, 1, 0.02, pool, Steps(measure="auto"))
    assert bar.noise is None and bar.settle_within == 20  # no noise measured: no cut
    pool.add(result(BASE, 104.0), "repeat")
    bar = prune_rule(best, 1, 0.02, pool, Steps(measure=30))
    assert bar.noise_dof == 1 and 0.02 < bar.noise < 0.03 and bar.best_runs == 2 and bar.settle_within == 30
