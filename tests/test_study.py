"""The search's space and its one-change-at-a-time steps, without running trials."""

from __future__ import annotations

import tuner
from tuner.space import Machine
from tuner.study import Space, baseline_knobs, build_space, guided_next

CPU = Machine(cuda=False, bf16=True, fp16=False)
SPACE = Space({
    "num_workers": (0, 1, 2, 4), "prefetch_factor": (2, 4), "pin_memory": (False,), "persistent_workers": (False, True),
    "amp_dtype": ("fp32", "bf16"), "micro_batch_size": (4, 8, 16), "zero_stage": (0,),
})
BASE = {"num_workers": 0, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": False,
        "amp_dtype": "fp32", "micro_batch_size": 8, "zero_stage": 0}


def test_waiting_on_data_climbs_workers_one_step_at_a_time():
    step = guided_next(SPACE, BASE, {"data_wait_share": 0.8}, lambda k: False)
    assert step == dict(BASE, num_workers=1, prefetch_factor=4, persistent_workers=True)
    # Incumbent now has 1 worker and still waits: the next step is 2.
    incumbent = dict(step)
    assert guided_next(SPACE, incumbent, {"data_wait_share": 0.5}, lambda k: False)["num_workers"] == 2


def test_a_climb_that_did_not_win_moves_on_to_other_knobs():
    tried = [dict(BASE, num_workers=1, prefetch_factor=4, persistent_workers=True)]
    step = guided_next(SPACE, BASE, {"data_wait_share": 0.8}, lambda k: k in tried)
    assert step == dict(BASE, amp_dtype="bf16")


def test_no_data_wait_goes_straight_to_one_knob_at_a_time_largest_micro_first():
    tried = [dict(BASE, amp_dtype="bf16")]
    step = guided_next(SPACE, BASE, {"data_wait_share": 0.0}, lambda k: k in tried)
    assert step == dict(BASE, micro_batch_size=16)


def test_exhausted_neighbourhood_hands_over_to_the_sampler():
    assert guided_next(SPACE, BASE, {"data_wait_share": 0.0}, lambda k: True) is None


def test_baseline_joins_searched_knobs_but_fixed_knobs_stay_fixed(toy):
    recipe = tuner.load_recipe(toy(space={"num_workers": [1, 2], "persistent_workers": True},
                                   baseline={"num_workers": 0}))
    space = build_space(recipe, CPU)
    assert space.choices["num_workers"] == (0, 1, 2)  # the baseline's 0 joins the list
    assert space.choices["persistent_workers"] == (True,)  # a scalar stays fixed
    assert space.choices["micro_batch_size"] == (16,)  # omitted: the baseline's (no accumulation)
    base = baseline_knobs(recipe, space, CPU)
    assert base["num_workers"] == 0 and base["persistent_workers"] is False  # measured as it is


def test_space_enumerates_distinct_configurations():
    configs = SPACE.configs(16, 1, CPU, "auto")
    # workers 0: 2 amp x 3 micro; workers 1/2/4: x 2 prefetch x 2 persistent
    assert len(configs) == 6 + 3 * 2 * 2 * 2 * 3
    assert len(set(configs)) == len(configs)
