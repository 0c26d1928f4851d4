"""The prune rule on windows whose truth is known: a trial whose first steps pay first-use
costs (timm's bf16: 1.6-1.9 s, then 0.25 s) is never cut on them, and one that really runs
far behind the best is cut as soon as its steady steps show it, never on two steps."""

from __future__ import annotations

import random

from tuner.harness.metrics import Window
from tuner.harness.prune import PruneBar, checks, steady

BATCH = 32


def window(times: list[float]) -> Window:
    return Window(step_times=list(times), samples=[BATCH] * len(times))


def test_steps_still_getting_faster_are_the_warm_up():
    assert steady([1.9, 1.6, 0.25, 0.26, 0.24, 0.25]) == 2
    assert steady([0.25, 0.26, 0.24, 0.25]) == 0 or steady([0.25, 0.26, 0.24, 0.25]) == 1
    assert steady([0.3]) == 0


def test_first_use_costs_past_the_warm_up_never_cut_a_gain():
    """bf16 at 0.25 s a step is 1.3x the best (0.33 s a step); its first two measured steps
    cost 1.6-1.9 s. The old rule cut it after two steps; this one waits for steady steps,
    which show it faster."""
    best = BATCH / 0.33
    rule = PruneBar(best, 1, 0.02, noise=0.05)
    times = [1.9, 1.6, 0.25, 0.26, 0.24, 0.25, 0.25, 0.26]
    assert not any(rule(window(times[:n])) for n in sorted(checks(16)) if n <= len(times))


def test_a_trial_far_behind_is_cut_on_its_steady_steps_and_never_on_two():
    rng = random.Random(0)
    best = BATCH / 0.10
    rule = PruneBar(best, 1, 0.02, noise=0.05)
    times = [0.25 * (1 + rng.gauss(0, 0.03)) for _ in range(12)]  # 2.5x slower than the best
    assert not rule(window(times[:2]))
    cut = next(n for n in sorted(checks(24)) if rule(window(times[:n])))
    assert cut in (3, 4)  # 4 when its first step happened to be its slowest (set aside as warm-up)


def test_near_the_best_it_runs_on_and_the_noise_widens_the_bar():
    """5% behind the best with runs 5% noisy: not shown slower by more than the 2% tolerance
    (the best's own run and this one are single runs), so it runs to the end; before the run
    knows its noise (10% assumed) a trial 30% behind is not cut either, where a known 2% is."""
    rng = random.Random(1)
    best = BATCH / 0.10
    near = [0.105 * (1 + rng.gauss(0, 0.02)) for _ in range(20)]
    assert not PruneBar(best, 1, 0.02, noise=0.05)(window(near))
    behind = [0.10 / 0.7 * (1 + rng.gauss(0, 0.02)) for _ in range(20)]
    assert not PruneBar(best, 1, 0.02, noise=None)(window(behind))
    assert PruneBar(best, 1, 0.02, noise=0.02)(window(behind))


def test_the_rule_travels_to_a_script_as_data():
    rule = PruneBar(123.0, 2, 0.03, 0.04)
    assert PruneBar.from_json(rule.to_json()) == rule
    assert PruneBar.from_json({"best": 1.0, "world_size": 1}) == PruneBar(1.0, 1)  # an older trial file
