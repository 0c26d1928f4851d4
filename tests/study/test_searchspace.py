"""The search's space and its one-change-at-a-time steps, without running trials."""

from __future__ import annotations

import dataclasses

import pytest

import tuner
from tuner.analysis.diagnose import Verdict
from tuner.inputs.space import Configs, Machine
from tuner.outputs import wording
from tuner.study.searchspace import Space, baseline_knobs, build_space
from tuner.tuning.events import Said
from tuner.tuning.proposing.guided import guided_next

from conftest import toy_recipe

CPU = Machine(cuda=False, bf16=True, fp16=False)
SPACE = Space({
    "num_workers": (0, 1, 2, 4), "prefetch_factor": (2, 4), "pin_memory": (False,), "persistent_workers": (False, True),
    "amp_dtype": ("fp32", "bf16"), "micro_batch_size": (4, 8, 16), "zero_stage": (0,),
})
BASE = {"num_workers": 0, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": False,
        "amp_dtype": "fp32", "micro_batch_size": 8, "zero_stage": 0}


def test_waiting_on_data_climbs_workers_one_step_at_a_time():
    step = guided_next(SPACE, BASE, {"data_wait_share": 0.8}, lambda k: False).knobs
    assert step == dict(BASE, num_workers=1, prefetch_factor=4, persistent_workers=True)
    # Incumbent now has 1 worker and still waits: the next step is 2.
    incumbent = dict(step)
    assert guided_next(SPACE, incumbent, {"data_wait_share": 0.5}, lambda k: False).knobs["num_workers"] == 2


def test_a_climb_that_did_not_win_moves_on_to_other_knobs():
    tried = [dict(BASE, num_workers=1, prefetch_factor=4, persistent_workers=True)]
    step = guided_next(SPACE, BASE, {"data_wait_share": 0.8}, lambda k: k in tried).knobs
    assert step == dict(BASE, amp_dtype="bf16")


def test_a_step_up_in_workers_that_ties_the_best_climbs_on():
    """One worker against none, measured 3% slower (within the run's noise), is no evidence
    that more workers lose: the climb goes on to 2; 20% slower ends it, as an unmeasured
    (pruned) step does."""
    one = dict(BASE, num_workers=1, prefetch_factor=4, persistent_workers=True)
    for measured, climbs in ((97.0, True), (80.0, False), (None, False)):
        step = guided_next(SPACE, BASE, {"data_wait_share": 0.8, "samples_per_s": 100.0}, lambda k: k == one,
                           rate=lambda k, m=measured: m if k == one else None).knobs
        assert (step == dict(one, num_workers=2)) == climbs, (measured, step)
        assert climbs or step == dict(BASE, amp_dtype="bf16")


def test_no_data_wait_goes_straight_to_one_knob_at_a_time_largest_micro_first():
    tried = [dict(BASE, amp_dtype="bf16")]
    step = guided_next(SPACE, BASE, {"data_wait_share": 0.0}, lambda k: k in tried).knobs
    assert step == dict(BASE, micro_batch_size=16)


def test_the_verdict_chooses_the_family_and_says_so():
    comm = [Verdict("communication-bound", 0.4, "communication-bound")]
    step = guided_next(SPACE, BASE, {"data_wait_share": 0.0}, lambda k: False, comm)
    assert step.knobs == dict(BASE, micro_batch_size=16)
    assert step.why == Said("points_at", {"kind": "communication-bound", "knob": "micro_batch_size"})
    assert wording.said(step.why) == "communication-bound points at micro_batch_size"
    memory = [Verdict("memory-bound", 0.95, "memory-bound")]
    step = guided_next(SPACE, dict(BASE, micro_batch_size=16), {"data_wait_share": 0.0}, lambda k: False, memory)
    assert step.knobs["micro_batch_size"] == 8  # smaller first: it frees memory
    saturated = [Verdict("host-cpu-saturated", 0.37, "workers-bought-nothing")]
    step = guided_next(SPACE, BASE, {"data_wait_share": 0.37}, lambda k: False, saturated)
    assert step.knobs["num_workers"] == 0 and step.knobs["amp_dtype"] == "bf16"  # no more workers


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
    configs = dataclasses.replace(SPACE, make=Configs(16, 1, CPU)).configs()
    # workers 0: 2 amp x 3 micro; workers 1/2/4: x 2 prefetch x 2 persistent
    assert len(configs) == 6 + 3 * 2 * 2 * 2 * 3
    assert len(set(configs)) == len(configs)


def _open_at_once(path: str, barrier, results, tuner_side: bool) -> None:
    import optuna

    from tuner.study import records as study_mod

    barrier.wait()
    try:
        if tuner_side:
            study_mod.open_study("race", f"sqlite:///{path}", 0)
        else:  # a poller (a dashboard, a test) opening the same new file
            optuna.load_study(study_name="race", storage=f"sqlite:///{path}")
        results.put("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.slow
def test_opening_a_new_study_while_another_process_opens_it_too(tmp_path):
    """Simultaneous opens of a new SQLite file collide on creating the schema (seen in CI:
    the search exited 2 at start while a test polled its study); the tuner's side retries."""
    import multiprocessing

    context = multiprocessing.get_context("fork")  # the parent has optuna loaded: quick races
    failures = []
    for i in range(10):  # without the retry, 4 of 20 such races failed here
        barrier, results = context.Barrier(2), context.Queue()
        path = str(tmp_path / f"{i}.db")
        procs = [context.Process(target=_open_at_once, args=(path, barrier, results, side)) for side in (True, False)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        tuner_result = [results.get(timeout=10) for _ in procs]
        failures += [r for r in tuner_result if "RecipeError" in r]
    assert failures == []


LEVERS = Space({**SPACE.choices, "zero_stage": (0, 2), "fsdp": ("off", "full_shard"),
                "activation_checkpointing": ("none", "selective", "full")})
LEVER_BASE = dict(BASE, fsdp="off", activation_checkpointing="none")


def test_a_micro_batch_that_did_not_fit_comes_back_with_checkpointing_selective_first():
    over = dict(LEVER_BASE, micro_batch_size=16)
    outcome = {str(sorted(over.items())): "over_budget"}
    tried = [over]

    def state(knobs):
        return outcome.get(str(sorted(knobs.items())))

    step = guided_next(LEVERS, LEVER_BASE, {"data_wait_share": 0.0}, lambda k: k in tried, outcome=state)
    assert step.knobs == dict(over, activation_checkpointing="selective")
    assert wording.said(step.why) == ("micro_batch_size 16 did not fit (over_budget): activation_checkpointing "
                                      "selective frees its activations")
    tried.append(step.knobs)
    again = guided_next(LEVERS, LEVER_BASE, {"data_wait_share": 0.0}, lambda k: k in tried, outcome=state)
    assert again.knobs == dict(over, activation_checkpointing="full")


def test_moving_to_fsdp_leaves_zero_and_back():
    memory = [Verdict("memory-bound", 0.95, "memory-bound")]
    on_zero = dict(LEVER_BASE, zero_stage=2)
    step = guided_next(LEVERS, on_zero, {"data_wait_share": 0.0}, lambda k: False, memory)
    assert step.knobs == dict(on_zero, fsdp="full_shard", zero_stage=0)  # memory-bound: fsdp first
    on_fsdp = dict(LEVER_BASE, fsdp="full_shard")
    tried = [dict(on_fsdp, fsdp="off")]
    step = guided_next(LEVERS, on_fsdp, {"data_wait_share": 0.0}, lambda k: k in tried, memory)
    assert step.knobs == dict(on_fsdp, zero_stage=2, fsdp="off")


ZERO = Space({**SPACE.choices, "zero_stage": (0, 1, 2, 3)})


def _state_of(outcomes):
    return lambda knobs: outcomes.get(str(sorted(knobs.items())))


def _walk(space, incumbent, tried, verdicts=(), outcome=lambda knobs: None):
    """Every guided step from ``incumbent`` until the neighbourhood is exhausted (each one
    marked tried as the search would)."""
    tried, steps = list(tried), []
    while (step := guided_next(space, incumbent, {"data_wait_share": 0.0}, lambda k: k in tried, verdicts,
                               outcome)) is not None:
        assert step.knobs not in tried and len(steps) < 50
        steps.append(step.knobs)
        tried.append(step.knobs)
    return steps


def test_along_an_ordered_knob_the_walk_ends_at_the_first_value_that_lost():
    """ZeRO 1 ran and lost to ZeRO 0: stages 2 and 3 are not the guided step's (DeepSpeed's
    autotuner stops there too); the smaller micro-batch past one that lost is not either."""
    steps = _walk(ZERO, BASE, [dict(BASE, zero_stage=1)])
    assert steps and all(s["zero_stage"] == 0 for s in steps), steps  # the rest of the neighbourhood, no ZeRO
    assert dict(BASE, micro_batch_size=16) in steps and dict(BASE, amp_dtype="bf16") in steps
    on_16 = dict(BASE, micro_batch_size=16)
    steps = _walk(ZERO, on_16, [dict(on_16, micro_batch_size=8)])
    assert steps and all(s["micro_batch_size"] == 16 for s in steps), steps  # 4 is past 8, which lost
    assert dict(on_16, zero_stage=1) in steps


def test_a_value_that_did_not_fit_does_not_end_the_walk_towards_less_memory():
    memory = [Verdict("memory-bound", 0.95, "memory-bound")]
    over = dict(BASE, zero_stage=1)
    step = guided_next(ZERO, BASE, {"data_wait_share": 0.0}, lambda k: k == over, memory,
                       _state_of({str(sorted(over.items())): "over_budget"}))
    assert step is not None and step.knobs == dict(BASE, zero_stage=2)
    # a larger micro-batch past one that did not fit cannot fit either
    small = dict(BASE, micro_batch_size=4)
    oom = dict(small, micro_batch_size=8)
    steps = _walk(ZERO, small, [oom], (), _state_of({str(sorted(oom.items())): "oom"}))
    assert steps and all(s["micro_batch_size"] == 4 for s in steps), steps
    assert dict(small, zero_stage=1) in steps  # more memory relief is still tried


def test_a_trial_another_worker_ended_meanwhile_is_not_a_crash(tmp_path):
    """A worker whose trial another worker failed meanwhile (judged dead: a late heartbeat)
    records nothing over it and goes on: what the other worker recorded stands."""
    import optuna

    from tuner.study import records as study_mod
    from tuner.trial.trial_result import TrialResult

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s", direction="maximize")
    trial = study.ask()
    other = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    other._storage.set_trial_user_attr(trial._trial_id, "reason", "its worker stopped mid-trial")
    other._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    recipe = tuner.load_recipe(toy_recipe(tmp_path))
    result = TrialResult({"num_workers": 0}, "ok", metrics={"samples_per_s": 10.0})
    from tuner.study.study import Asked, Study
    from tuner.study.trial_record import Status

    state, frozen = study_mod.record(Study(study), Asked(trial), result, recipe.budget)
    assert state == "ok" and frozen.status == Status.FAIL
    assert frozen.attrs["reason"] == "its worker stopped mid-trial"
