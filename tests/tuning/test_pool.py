"""Every measurement of a configuration pooled: the noise it gives, pairs within a round,
what the attribution still has to measure, what may be the answer, the prune bar's noise.

Pure functions of the rates measured, fed rates of known configurations (a scripted
``run``); the real trials behind them are exercised end to end in test_search.py, the
finish's decisions in test_finish.py.
"""

from __future__ import annotations

import itertools

from tuner.inputs.plan import Plan
from tuner.inputs.space import Machine, make_config
from tuner.outputs import wording
from tuner.trial.trial_result import State, TrialResult
from tuner.tuning.pool import Pool

CPU = Machine(cuda=False, bf16=True, fp16=False)
JITTER = (1.0, 1.02, 0.98, 1.01, 0.99)
"""One run's noise ~1.6% (relative standard deviation)."""
QUIET = (1.0, 1.001, 0.999, 1.0005, 0.9995)
"""~0.08%: a host wait that costs the same every step."""


def config(**knobs) -> Plan:
    return make_config({"num_workers": 0, "micro_batch_size": 8, **knobs}, 16, 1, CPU, "auto")[0]


def result(c: Plan, rate: float, state: State = State.OK) -> TrialResult:
    metrics = {"samples_per_s": rate} if state == State.OK else None
    return TrialResult(c.params(), state, None if state == State.OK else "boom", metrics)


class Scripted:
    """Measures each configuration at its true rate times a small repeating jitter."""

    def __init__(self, truth: dict[Plan, float], jitter: tuple[float, ...] = JITTER) -> None:
        self.truth, self.calls = truth, []
        self.jitter = {c: itertools.cycle(jitter) for c in truth}

    def __call__(self, c: Plan) -> TrialResult:
        self.calls.append(c)
        return result(c, self.truth[c] * next(self.jitter[c]))


BASE, TWO, FOUR, FOUR_BIG = config(), config(num_workers=2), config(num_workers=4), config(num_workers=4,
                                                                                             micro_batch_size=16)


def test_noise_is_pooled_over_repeated_configurations_with_no_floor():
    pool = Pool()
    assert pool.known_noise() is None  # nothing assumed
    for rate in (100, 110, 90):
        pool.add(result(BASE, rate), "search")
    pool.add(result(TWO, 200), "search")  # measured once: no say in the noise
    assert 0.09 < pool.known_noise() < 0.11
    assert pool.spread()[1] == 2  # honest degrees of freedom: 3 runs of one configuration
    same = Pool()
    for _ in range(3):
        same.add(result(BASE, 100), "search")
    assert same.known_noise() == 0.0


def test_a_pruned_trial_is_not_a_measurement():
    pool = Pool()
    cut = result(BASE, 10)
    cut.pruned_at = (3, 10.0)
    pool.add(cut, "search")
    assert pool.rates(BASE.params()) == []


def test_runs_of_a_round_are_paired_so_a_drift_both_share_cancels():
    """The machine slows 3% a round (a random walk both configurations share): the paired
    interval of a 5% difference stays narrow and decides it; the unpaired one, pooling the
    same runs, is wide (a 3% walk let a 0% change be kept 86% of the time unpaired)."""
    import math
    import random

    from tuner.stats.interval import slowdown

    rng = random.Random(0)
    pool, speed = Pool(), 0.0
    for r in range(10):
        speed += rng.gauss(0, 0.03)
        for c, truth in ((FOUR, 105.0), (TWO, 100.0)):
            pool.add(result(c, truth * math.exp(speed + rng.gauss(0, 0.005))), "finish", ("finish", r))
    paired = pool.slowdown(FOUR.params(), TWO.params())
    unpaired = slowdown(pool.entry(FOUR.params()).stats, pool.entry(TWO.params()).stats)
    assert paired is not None and paired.pairs == 10 and 0.02 < paired.low and paired.high < 0.07
    assert unpaired is not None and unpaired.half_log > 3 * paired.half_log
    assert pool.blocked()[1] == 20 - 2 - 10 + 1  # runs less configurations less rounds plus one group


def test_a_search_trial_against_another_is_read_unpaired():
    pool = Pool()
    for rate in (100, 104, 98):
        pool.add(result(BASE, rate), "search")
    pool.add(result(TWO, 200), "search")
    s = pool.slowdown(TWO.params(), BASE.params())
    assert s is not None and s.pairs == 0 and s.dof == 2 and s.low > 0.25  # the baseline's repeats give the noise


def test_the_source_of_a_number_says_what_each_run_was_for():
    pool = Pool()
    pool.add(result(BASE, 100), "search")
    pool.add(result(BASE, 101), "repeat")
    for r in range(2):
        pool.add(result(BASE, 99), "finish", ("finish", r))
    assert pool.source(BASE.params()) == {"search": 1, "repeat": 1, "finish": 2}
    assert wording.source(pool.source(BASE.params())) == "median of 4 runs (1 search trial, 1 repeat, 2 finish runs)"


def make(knobs) -> dict:
    return config(**{k: v for k, v in knobs.items() if k in ("num_workers", "micro_batch_size",
                                                               "persistent_workers")}).params()


def test_the_attribution_measures_only_the_points_it_lacks_inside_the_budget():
    from tuner.tuning import finish, path

    truth = {BASE: 100, FOUR: 150, config(micro_batch_size=16): 110, FOUR_BIG: 200}
    run = Scripted(truth)
    pool = Pool()
    for c in (BASE, FOUR_BIG):
        for _ in range(2):
            pool.add(run(c), "finish")
    run.calls.clear()
    points = path.configs(BASE.params(), FOUR_BIG.params(), make)
    done = path.describe(list(points.values()), 2, lambda p: run(Plan.of(1, **p)), pool, finish.Budget(None))
    # the path's middle point (workers only) doubles as the leave-one-out of micro_batch_size
    assert done == 4 and sorted(c.params()["num_workers"] * 100 + c.params()["micro_batch_size"]
                                for c in run.calls) == [16, 16, 408, 408]
    table = path.table(BASE.params(), FOUR_BIG.params(), pool, make, 0.02)
    assert [r.knob for r in table.rows] == ["num_workers", "micro_batch_size"]
    assert table.baseline == pool.median(BASE.params()) and table.best == pool.median(FOUR_BIG.params())
    run.calls.clear()
    tight = finish.Budget(1.0, typical_s=2.0, clock=lambda: 0.0)
    assert path.describe(list(points.values()), 2, lambda p: run(Plan.of(1, **p)), Pool(), tight) == 0


def test_a_configuration_outside_the_space_is_never_the_answer(toy):
    """The baseline has no workers, so its persistent_workers is the default false; the best
    runs 4 workers, persistent. Without persistence it may be the answer where the space
    allows false, never where the recipe fixes it true."""
    import tuner
    from tuner.study.searchspace import Space
    from tuner.tuning.recommend import answerable

    base, without = config(), config(num_workers=4, persistent_workers=False)
    pool = Pool()
    for _ in range(2):
        pool.add(result(without, 200), "finish")
    recipe = tuner.load_recipe(toy())
    choices = {k: (v,) for k, v in base.params().items() if k not in ("grad_accum_steps", "engine")}
    choices["num_workers"] = (0, 4)
    assert answerable(without.params(), pool, recipe, None, Space({**choices, "persistent_workers": (False, True)}))
    assert not answerable(without.params(), pool, recipe, None, Space({**choices, "persistent_workers": (True,)}))


def test_the_prune_bar_reads_the_noise_the_run_measured_and_the_window_it_measures():
    """The search's bar: no noise before any repeat (no cut), then the pooled noise with its
    degrees of freedom, the best's own runs, and the run's typical window for plateaus."""
    from tuner.inputs.recipe import Steps
    from tuner.study.trial_record import Record, Status
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


def test_one_round_is_read_paired_on_the_noise_the_search_measured():
    """The DeepSpeed benchmark's finish: after two rounds of four configurations the rounds' own
    noise had 3 degrees of freedom (t 5.8 at 99%) where the search's repeats had given 18, and
    a question the unpaired interval had decided came open again for a third round. A pair
    borrows the run's pooled spread (the wider estimate: drift left in) until the rounds' own
    noise has BLOCKED_DOF, and reads it alone from then on."""
    from tuner.tuning.pool import BLOCKED_DOF

    pool = Pool()
    for rate in (100, 103, 97, 101, 99):
        pool.add(result(BASE, rate), "search")
    pool.add(result(FOUR, 150), "search")
    pool.add(result(BASE, 100), "finish", ("finish", 0))
    pool.add(result(FOUR, 152), "finish", ("finish", 0))
    assert pool.blocked()[1] == 0 and pool.paired_noise() == pool.spread()
    s = pool.slowdown(FOUR.params(), BASE.params())
    assert s is not None and s.pairs == 1 and s.dof == pool.spread()[1] and s.low > 0.25  # one pair decides 1.5x
    for r in range(1, BLOCKED_DOF + 2):
        pool.add(result(BASE, 100 + r % 2), "finish", ("finish", r))
        pool.add(result(FOUR, 151 - r % 2), "finish", ("finish", r))
    assert pool.blocked()[1] >= BLOCKED_DOF and pool.paired_noise() == pool.blocked()
