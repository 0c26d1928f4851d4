"""``steps.measure: auto``: windows that end when samples/s is known, not after a count."""

from __future__ import annotations

import random

import pytest

import tuner
from tuner.stats.window_length import AUTO, Auto, rate_uncertainty


def test_uncertainty_counts_correlated_steps_as_fewer_and_shrinks_with_length():
    rng = random.Random(0)
    short = [0.01 * (1 + 0.2 * rng.random()) for _ in range(20)]
    long = [0.01 * (1 + 0.2 * rng.random()) for _ in range(400)]
    assert rate_uncertainty(long) < rate_uncertainty(short)
    assert rate_uncertainty([0.01, 0.01]) is None
    assert rate_uncertainty([0.01] * 50) == 0.0
    # a slow drift (correlated neighbours) is less certain than the same values shuffled
    drift = [0.01 * (1 + i / 40) for i in range(40)]
    shuffled = drift[:]
    random.Random(1).shuffle(shuffled)
    assert rate_uncertainty(drift) > 2 * rate_uncertainty(shuffled)


def test_the_rule_waits_for_its_minimums_and_stops_at_its_caps():
    rule = Auto(half_width=0.03, min_steps=8, min_s=1.0, max_steps=400, max_s=30.0)
    assert AUTO.max_steps == 2000  # a 1 ms step measures for at least a second
    assert not rule.enough([0.5] * 7)  # stable, but fewer than 8 steps
    assert rule.enough([0.5] * 8)  # 8 stable steps over 4 s
    assert not rule.enough([0.01] * 50)  # stable, but only 0.5 s
    assert rule.enough([0.01] * 100)
    noisy = [0.01, 0.05] * 100
    assert not rule.enough(noisy[:199]) or rate_uncertainty(noisy[:199]) <= 0.03
    assert rule.enough([0.01, 0.5] * 200)  # never stable: 400 steps is the cap
    assert rule.enough([10.0] * 3)  # 30 s is the cap
    assert rule.next_check(8) == 9 and rule.next_check(100) == 120 and rule.next_check(390) == 400


@pytest.mark.slow
def test_a_slow_step_is_not_over_measured_and_a_fast_one_gets_enough_steps(toy):
    slow = tuner.measure(toy(task_args={"step_ms": 250}, steps={"warmup": 1, "measure": "auto"}))
    m = slow.metrics
    assert slow.state == "ok" and AUTO.min_steps <= m["measured_steps"]
    # a steady 0.25 s step is not measured 20 times; a sleep that load made jitter (22 steps
    # beside a busy machine, CI 2026-12-05) needs what the rule asks, and its spread shows it
    steady = m["step_time_p90_s"] / m["step_time_p50_s"] < 1.02
    assert m["measured_steps"] < 20 or not steady, m
    assert m["samples_per_s_ci"] <= AUTO.half_width
    fast = tuner.measure(toy(task_args={"cached": True}, steps={"warmup": 2, "measure": "auto"}))
    m = fast.metrics
    # a ~1 ms step: hundreds of steps on a quiet machine, 37 beside two busy processes (CI,
    # 2026-12-05); always more than the slow step's, and the window's length below holds
    assert m["measured_steps"] > slow.metrics["measured_steps"]
    assert m["measured_s"] >= AUTO.min_s or m["measured_steps"] == AUTO.max_steps  # a second, unless the step cap
    assert m["samples_per_s_ci"] <= AUTO.half_width or m["measured_steps"] == AUTO.max_steps \
        or m["measured_s"] >= AUTO.max_s  # a noisy machine: the caps end it


@pytest.mark.parametrize("value", ["often", 0, 2.5])
def test_a_window_that_is_neither_auto_nor_a_count_is_refused(toy, value):
    with pytest.raises(tuner.RecipeError, match="steps.measure"):
        tuner.load_recipe(toy(steps={"measure": value}))


def test_a_first_use_plateau_of_any_length_up_to_half_the_window_is_set_aside():
    from tuner.stats.window_length import settled, warm_up

    assert warm_up([1.9, 1.6, 0.25, 0.26, 0.24, 0.25]) == 2  # getting faster
    assert warm_up([3, 3, 3, 1, 1, 1, 1, 1]) == 3  # a plateau the old rule did not see
    assert warm_up([3] * 5 + [1] * 6) == 5
    assert warm_up([3] * 6 + [1] * 4) == 0  # over half the window: that is the job's cost
    assert warm_up([0.25, 0.26, 0.24, 0.25]) == 0 and warm_up([0.3]) == 0
    assert list(settled([3, 3, 1, 1, 1, 1])) == [1, 1, 1, 1]
    rng = random.Random(0)  # steady noise alone: the first step is the slowest about 1 time in n
    found = [warm_up([rng.random() for _ in range(20)]) for _ in range(4000)]
    assert sum(k > 0 for k in found) / 4000 < 0.08 and sum(k > 1 for k in found) / 4000 < 0.015


def test_an_auto_window_judges_its_settled_steps():
    rule = Auto(half_width=0.03, min_steps=8, min_s=1.0, max_steps=400, max_s=30.0)
    assert not rule.enough([1.5] * 5 + [0.5] * 6)  # 6 settled steps: fewer than 8
    assert rule.enough([1.5] * 5 + [0.5] * 10)


def test_the_rate_of_a_window_sets_its_plateau_aside():
    """First 2 steps 3x slower (a first use past the warm-up): the rate is the steady one's,
    where averaging them in read x0.93 (0.25 s steps) to x0.74 (1 s steps) before."""
    from tuner.harness.metrics import Window, summarize

    w = Window(step_times=[3.0, 3.0] + [1.0] * 10, samples=[8] * 12, data_waits=[0.0] * 12, wall_s=16.0, cpu_s=1.0)
    m = summarize([w])
    assert m["samples_per_s"] == 8.0 and m["warmup_set_aside"] == 2 and m["measured_steps"] == 10
