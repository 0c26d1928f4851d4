"""The end of a search decides from pooled measurements: when to stop confirming, what the
attribution still has to measure, which of equals to recommend.

The decisions are pure functions of the rates measured, so these tests feed them rates of
known configurations (a scripted ``run``); the real trials behind them are exercised end
to end in test_search.py.
"""

from __future__ import annotations

import itertools

from tuner.config.space import Config, Machine, make_config
from tuner.trial.result import State, TrialResult
from tuner.tuning.finalists import attribute, confirm
from tuner.tuning.pool import NOISE_FLOOR, NOISE_UNKNOWN, Pool

CPU = Machine(cuda=False, bf16=True, fp16=False)
JITTER = (1.0, 1.02, 0.98, 1.01, 0.99)


def config(**knobs) -> Config:
    return make_config({"num_workers": 0, "micro_batch_size": 8, **knobs}, 16, 1, CPU, "auto")[0]


def result(c: Config, rate: float, state: State = State.OK) -> TrialResult:
    metrics = {"samples_per_s": rate} if state == State.OK else None
    return TrialResult(c.params(), state, None if state == State.OK else "boom", metrics)


class Scripted:
    """Measures each configuration at its true rate times a small repeating jitter."""

    def __init__(self, truth: dict[Config, float]) -> None:
        self.truth, self.calls = truth, []
        self.jitter = {c: itertools.cycle(JITTER) for c in truth}

    def __call__(self, c: Config) -> TrialResult:
        self.calls.append(c)
        return result(c, self.truth[c] * next(self.jitter[c]))


BASE, TWO, FOUR, FOUR_BIG = config(), config(num_workers=2), config(num_workers=4), config(num_workers=4,
                                                                                             micro_batch_size=16)


def test_noise_is_pooled_over_repeated_configurations_and_floored():
    pool = Pool()
    assert pool.noise() == NOISE_UNKNOWN
    for rate in (100, 110, 90):
        pool.add(result(BASE, rate), "search")
    pool.add(result(TWO, 200), "search")  # measured once: no say in the noise
    assert 0.09 < pool.noise() < 0.11
    same = Pool()
    for _ in range(3):
        same.add(result(BASE, 100), "search")
    assert same.noise() == NOISE_FLOOR


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
    out = confirm([TWO.params(), FOUR.params()], BASE.params(), 5, run, pool, lambda x: x, None)
    assert out is not None and out.rounds == 1 and out.winner == TWO.params()
    # one round, not 5; the baseline, 3x slower than the fastest's search trial (beyond even
    # the noise assumed before any repeat), is not measured again; nor is FOUR once TWO's
    # repeat has shown the noise (2%) and FOUR's search trial 34% below it
    assert run.calls == [TWO]
    assert "apart from the others beyond the noise" in out.notes[0]
    assert pool.source(TWO.params()) == "median of 2 runs (1 search trial, 1 confirmation)"


def test_the_baseline_and_far_finalists_are_measured_again_only_when_the_noise_could_explain_them():
    run = Scripted({BASE: 100, TWO: 125, FOUR: 120, FOUR_BIG: 40})
    pool = Pool()
    for c in (BASE, TWO, FOUR, FOUR_BIG):
        pool.add(run(c), "search")
    run.calls.clear()
    confirm([TWO.params(), FOUR.params(), FOUR_BIG.params()], BASE.params(), 1, run, pool, lambda x: x, None)
    # FOUR_BIG's search trial is 68% below the fastest's: no noise makes that; the baseline
    # is 20% below: the noise assumed before any repeat (10% a run) could, so it runs again
    assert run.calls == [BASE, TWO, FOUR]


def test_the_ends_of_an_attribution_apart_beyond_the_noise_need_one_run_each():
    run = Scripted({BASE: 100, FOUR: 300})
    pool = Pool()
    for c in (BASE, FOUR):
        pool.add(run(c), "search")
    run.calls.clear()
    table = attribute(BASE.params(), FOUR.params(), 3, run, pool, make, None)
    assert run.calls == [] and table is not None and table.best == 300


def test_equals_stop_before_the_cap_and_recommend_the_fewest_changes():
    """0.5% apart with runs 2% noisy: after two runs each they are within one standard error,
    so the third round (the cap) is not measured."""
    run = Scripted({BASE: 100, FOUR: 200, FOUR_BIG: 201})
    pool = Pool()
    out = confirm([FOUR_BIG.params(), FOUR.params()], BASE.params(), 3, run, pool, lambda x: x, None)
    assert out is not None and out.rounds == 2
    assert out.winner == FOUR.params()  # one change from the baseline, not two
    assert run.calls.count(BASE) == 1  # the baseline joins the first round only
    assert len(out.equals) == 2
    assert any("simplest of equals" in n for n in out.notes)


def test_a_finalist_left_behind_is_no_longer_measured():
    run = Scripted({BASE: 100, TWO: 150, FOUR: 151, FOUR_BIG: 60})
    pool = Pool()
    confirm([FOUR.params(), TWO.params(), FOUR_BIG.params()], BASE.params(), 3, run, pool, lambda x: x, None)
    assert run.calls.count(FOUR_BIG) == 1  # dropped after the first round
    assert run.calls.count(FOUR) == 2  # then equal to TWO within one standard error: done


def test_finalists_neither_apart_nor_equal_go_on_to_the_cap():
    """4% apart with runs at the 2% noise floor: more than one standard error of the
    difference, less than two, after every round."""
    run = Scripted({BASE: 100, TWO: 104, FOUR: 100})
    run.jitter[TWO] = run.jitter[FOUR] = itertools.repeat(1.0)
    pool = Pool()
    out = confirm([TWO.params(), FOUR.params()], BASE.params(), 3, run, pool, lambda x: x, None)
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


def test_a_knob_left_out_of_the_answer_must_leave_a_point_of_the_space(toy):
    """The baseline has no workers, so its persistent_workers is the default false; the best
    runs 4 workers, persistent. That persistence buys nothing measurable: the best without
    it is recommended where the space allows false, never where the recipe fixes it true."""
    import tuner
    from tuner.tuning.recommend import simpler
    from tuner.tuning.searchspace import Space

    base = config()
    best = config(num_workers=4, persistent_workers=True)
    without = config(num_workers=4, persistent_workers=False)
    run = Scripted({base: 100, best: 200, without: 199})
    pool = confirmed_twice(run, base, best, without)
    table = attribute(base.params(), best.params(), 1, run, pool, make, None)
    assert table is not None
    recipe = tuner.load_recipe(toy())
    choices = {k: (v,) for k, v in base.params().items() if k not in ("grad_accum_steps", "engine")}
    choices["num_workers"] = (0, 4)
    free = Space({**choices, "persistent_workers": (False, True)})
    fixed = Space({**choices, "persistent_workers": (True,)})
    picked = simpler(best.params(), table, pool, base.params(), make, recipe, None, free)
    assert picked is not None and picked[0] == without.params() and "without persistent_workers" in picked[1]
    assert simpler(best.params(), table, pool, base.params(), make, recipe, None, fixed) is None
    assert fixed.holds(base.params(), 1)  # without workers persistent_workers means nothing
