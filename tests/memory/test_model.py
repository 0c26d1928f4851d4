"""The memory model: model states by engine and sharding, and a fit that learns the rest."""

from __future__ import annotations

import sys

import pytest
import torch

from tuner.inputs.plan import Plan
from tuner.inputs.space import Machine, make_config
from tuner.memory.model import GIB, MemoryModel, Prediction, activation_units, states_bytes
from tuner.trial.layout_rules import rank_parameters

from conftest import TESTS

P = 1_000_000  # parameters


def plan(world: int = 1, **knobs) -> Plan:
    """A plan of these knobs (micro-batch 1, no accumulation, the rest at their defaults)."""
    return Plan.of(world, **{"micro_batch_size": 1, "grad_accum_steps": 1, **knobs})


@pytest.mark.parametrize("knobs, per_param", [
    ({}, 16),                                                   # fp32 params + grads + AdamW's two moments
    ({"zero_stage": 1}, 4 + 4 + 8 / 4),                         # ZeRO-1: optimizer states sharded over 4
    ({"zero_stage": 2}, 4 + 4 / 4 + 8 / 4),
    ({"zero_stage": 3}, (4 + 4 + 8) / 4),
    ({"zero_stage": 3, "amp_dtype": "bf16"}, (2 + 2 + 12) / 4),  # DeepSpeed's half params + fp32 master
    ({"fsdp": "full_shard"}, (4 + 4 + 8) / 4),
    ({"fsdp": "shard_grad_op"}, 4 + (4 + 8) / 4),               # parameters stay gathered fwd -> bwd
])
def test_model_states_by_engine_and_sharding(knobs, per_param):
    assert states_bytes(P, plan(4, **knobs), 4, host_is_device=True) == pytest.approx(per_param * P)


def test_offload_moves_states_off_a_gpu_but_not_off_the_host():
    knobs = plan(2, zero_stage=2, offload_optimizer="cpu")
    assert states_bytes(P, knobs, 2, host_is_device=False) == pytest.approx((4 + 2) * P)
    assert states_bytes(P, knobs, 2, host_is_device=True) == pytest.approx((4 + 2 + 4) * P)
    fsdp = plan(2, fsdp="full_shard", offload_optimizer="cpu")
    assert states_bytes(P, fsdp, 2, host_is_device=False) == 0.0


def test_the_fit_learns_activations_per_sample_and_per_group():
    model = MemoryModel(P, overhead_bytes=0.3 * GIB, world_size=1, host_is_device=True)
    first = model.predict(plan(micro_batch_size=8))
    assert first.basis == "analytic" and first.peak_gib == pytest.approx(0.3 + 16 * P / GIB)

    def truth(micro, checkpointing="none"):  # 0.5 GiB + states + 2 MiB a sample (0.2 MiB checkpointed)
        per = 2 if checkpointing == "none" else 0.2
        return (0.5 * GIB + 16 * P + per * micro * 2**20) / GIB

    for micro in (8, 64):
        knobs = plan(micro_batch_size=micro, activation_checkpointing="none")
        model.observe(knobs, model.predict(knobs).peak_gib, truth(micro))
    fitted = model.predict(plan(micro_batch_size=32))
    assert fitted.basis == "fitted" and fitted.peak_gib == pytest.approx(truth(32), rel=1e-6)
    # a group not measured yet: the prior (a tenth for full checkpointing), then its own slope
    assert model.predict(plan(micro_batch_size=64, activation_checkpointing="full")).peak_gib == \
        pytest.approx(truth(64, "full"), rel=0.02)
    for micro in (16, 128):
        knobs = plan(micro_batch_size=micro, activation_checkpointing="full")
        model.observe(knobs, model.predict(knobs).peak_gib, truth(micro, "full"))
    assert model.predict(plan(micro_batch_size=256, activation_checkpointing="full")).peak_gib == \
        pytest.approx(truth(256, "full"), rel=1e-3)
    error = model.error(skip_first=1)
    assert error["trials"] == 3 and error["median"] < 0.05


def test_skipping_needs_evidence_or_a_lower_bound():
    model = MemoryModel(P, overhead_bytes=0.5 * GIB, world_size=1, host_is_device=True)
    first = model.predict(plan(micro_batch_size=8))
    assert "a lower bound" in model.skip_reason(first, budget_gib=0.4)  # overhead + states alone are over
    assert model.skip_reason(first, budget_gib=1.0) is None
    model.observe(plan(micro_batch_size=8), None, 0.6)
    assert model.skip_reason(model.predict(plan(micro_batch_size=8)), 0.4) is None  # one point: no fit yet


def test_a_configuration_predicted_over_the_budget_is_skipped_not_run(toy, tmp_path):
    import tuner
    from tuner.inputs.space import Machine
    from tuner.study import records as study_mod
    from tuner.study.searchspace import build_space
    from tuner.trial.trial_result import State, TrialResult
    from tuner.tuning.decider import Decider
    from tuner.tuning.events import SearchEvents

    recipe = tuner.load_recipe(toy(space={"micro_batch_size": [1, 2, 4, 8, 16]}, baseline={"micro_batch_size": 1},
                                   budget={"memory_gib": 0.36, "trials": 10}, out=str(tmp_path / "run")))
    machine = Machine.detect()
    decider = Decider(recipe, build_space(recipe, machine), machine, SearchEvents())
    assert decider.next(False)["config"].micro_batch_size == 1  # the baseline runs, whatever is predicted

    def peak(micro):  # what this job measures: 0.30 GiB and 0.01 GiB a sample
        return 0.30 + 0.01 * micro

    metrics = {"samples_per_s": 100.0, "peak_mem_gib": peak(1), "host_mem_gib": peak(1), "data_wait_share": 0.0}
    decider.record(TrialResult(decider.current.params(), State.OK, metrics=metrics, losses=[1.0]))
    for micro in (2, 4):  # what earlier trials taught it, as a resumed study would: fitted within 1%
        decider.memory.observe(decider.baseline_config.replace(micro_batch_size=micro), peak(micro) * 1.01,
                               peak(micro), "fitted")
    order = decider.next(False)
    skipped = [t for t in decider.study.records() if t.outcome == State.SKIPPED]
    assert [t.params["micro_batch_size"] for t in skipped] == [16, 8]  # largest first, both over
    assert skipped[0].get("ruled") == {"code": "over_memory", "figures": {
        "why": "predicted 0.46 GiB > budget 0.36 GiB (model error so far ±1%)"}}
    assert order["config"].micro_batch_size == 4  # predicted 0.34: it runs
    assert [t.outcome for t in study_mod.measured(decider.study)] == ["ok", "skipped", "skipped"]
    from tuner.tuning import budget

    assert budget.stop_reason(decider.study, recipe.budget, recipe.target, 0.0) is None  # skips cost no trials


def test_with_skipping_off_every_configuration_runs(toy, tmp_path):
    import tuner
    from tuner.inputs.space import Machine
    from tuner.study.searchspace import build_space
    from tuner.trial.trial_result import State, TrialResult
    from tuner.tuning.decider import Decider
    from tuner.tuning.events import SearchEvents

    recipe = tuner.load_recipe(toy(space={"micro_batch_size": [1, 16]}, baseline={"micro_batch_size": 1},
                                   budget={"memory_gib": 0.36, "skip": False}, out=str(tmp_path / "run")))
    machine = Machine.detect()
    decider = Decider(recipe, build_space(recipe, machine), machine, SearchEvents())
    decider.next(False)
    metrics = {"samples_per_s": 100.0, "peak_mem_gib": 0.31, "host_mem_gib": 0.31, "data_wait_share": 0.0}
    decider.record(TrialResult(decider.current.params(), State.OK, metrics=metrics, losses=[1.0]))
    for micro, peak in ((2, 0.32), (4, 0.34)):
        decider.memory.observe(decider.baseline_config.replace(micro_batch_size=micro), peak, peak, "fitted")
    assert decider.next(False)["config"].micro_batch_size == 16  # predicted 0.46 GiB, run anyway


def test_the_plan_seed_weighs_each_micro_batch_at_its_own_accumulation(toy, tmp_path, monkeypatch):
    """The seed's candidates make up the global batch: a GPipe stage holds every micro-batch of
    a step, so a candidate at the baseline's accumulation over-predicts a larger micro-batch."""
    import tuner
    from tuner.memory import model as memory
    from tuner.study.searchspace import build_space
    from tuner.tuning.decider import Decider
    from tuner.tuning.events import SearchEvents

    recipe = tuner.load_recipe(toy(space={"micro_batch_size": [1, 2, 4, 8]}, baseline={"micro_batch_size": 1},
                                   budget={"memory_gib": 0.36}, out=str(tmp_path / "run")))
    machine = Machine.detect()
    decider = Decider(recipe, build_space(recipe, machine), machine, SearchEvents())
    weighed: list[Plan] = []
    monkeypatch.setattr(memory, "feed_plan", lambda *args: (3, None))  # as if tuner plan had profiled 3 trials
    monkeypatch.setattr(memory, "largest_fitting", lambda model, plans, limit: (weighed.extend(plans), (None, None))[1])
    decider._seed()
    assert {p.micro_batch_size: p.grad_accum_steps for p in weighed} == {1: 16, 2: 8, 4: 4, 8: 2}


def test_loader_workers_alone_are_enough_to_fit_their_memory():
    """The issue's job: each loader worker holds a 256 MiB index, the micro-batch never
    changes. Two worker counts fit the per-worker bytes; the third prediction is exact, and
    another micro-batch (never seen) is not claimed as fitted."""
    model = MemoryModel(P, overhead_bytes=0.3 * GIB, world_size=1, host_is_device=True)

    def truth(workers):
        return 0.45 + 0.25 * workers

    for workers in (0, 1):
        knobs = plan(micro_batch_size=16, num_workers=workers)
        model.observe(knobs, model.predict(knobs).peak_gib, truth(workers))
    three = model.predict(plan(micro_batch_size=16, num_workers=3))
    assert three.basis == "fitted" and three.peak_gib == pytest.approx(truth(3), rel=1e-6)
    assert model.predict(plan(micro_batch_size=32, num_workers=0)).basis == "analytic"


def test_each_measured_group_gets_its_own_slope_whatever_the_prior():
    """bf16 keeps 0.6x fp32's activations here, where the prior says 0.5x: with one group at
    two micro-batches, every measured group is fitted with its own slope, so fp32 at a new
    micro-batch is predicted from fp32's own point, not bent by the prior."""
    model = MemoryModel(P, overhead_bytes=0.3 * GIB, world_size=1, host_is_device=True)

    def truth(micro, amp):
        per = 2.0 if amp == "fp32" else 1.2  # MiB a sample
        return (0.5 * GIB + model._states(plan(amp_dtype=amp)) + per * micro * 2**20) / GIB

    for micro, amp in ((4, "fp32"), (4, "bf16"), (16, "bf16")):
        knobs = plan(micro_batch_size=micro, amp_dtype=amp)
        model.observe(knobs, model.predict(knobs).peak_gib, truth(micro, amp))
    assert model.predict(plan(micro_batch_size=16, amp_dtype="fp32")).peak_gib == pytest.approx(truth(16, "fp32"),
                                                                                                   rel=1e-6)


def test_memory_outside_the_allocator_is_learnt_from_trials_and_skips_with_it():
    """Trials measured 1.5 GiB more in NVML's count of the process than the allocator's
    peak (a CUDA context and NCCL's buffers): a configuration predicted at 9 GiB against a
    10 GiB budget is then over it, and the reason says by what; before any GPU trial, or on
    a CPU (no process figure), nothing is added."""
    model = MemoryModel(parameters=1000, overhead_bytes=0.0, world_size=1, host_is_device=False)
    assert model.outside_gib() == 0.0
    assert model.skip_reason(Prediction(9.0, "analytic"), 10.0) is None
    for micro, peak in ((4, 4.0), (8, 6.0), (16, 10.0)):
        model.observe(plan(micro_batch_size=micro), peak, peak, "fitted", process_gib=peak + 1.5)
    model.observe(plan(micro_batch_size=2), 3.0, 3.0, "fitted")  # no process figure: nothing learnt
    assert model.outside_gib() == 1.5 and len(model.outside) == 3
    why = model.skip_reason(Prediction(9.0, "fitted"), 10.0)
    assert why is not None and "less 1.50 GiB outside the allocator" in why
    assert model.skip_reason(Prediction(8.0, "fitted"), 10.0) is None


def test_a_layout_puts_its_stages_and_shards_on_a_rank():
    """The parallel layout's states (issue 27): the busiest rank's parameters, counted on
    the meta device, sharded over the data-parallel ranks only; a pipeline's activations are
    its stage's share of the micro-batches in flight (all of them under GPipe)."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(TESTS / "helpers"))
    from tiny_llama import tiny_llama

    with torch.device("meta"):
        llama = tiny_llama(4)  # 4 x 36,992 in the blocks (36,864 of them in projections), 2 x 16,384 + 64 outside
    assert rank_parameters(llama, 1, 1) == 180_800
    # the plan's projections halved, and the embedding and head split over the vocabulary (256 / 2)
    assert rank_parameters(llama, 2, 1) == 180_800 - 4 * 36_864 // 2 - 2 * 16_384 // 2
    assert rank_parameters(llama, 1, 2) == 2 * 36_992 + 64 + 16_384  # the last stage: 2 blocks, norm, head
    assert rank_parameters(llama, 1, 2, virtual=2) == rank_parameters(llama, 1, 2)  # stages 1 and 3 of 4
    model = MemoryModel(180_800, 0.0, 8, host_is_device=False,
                        rank_parameters=lambda tp, pp, v: rank_parameters(llama, tp, pp, v))
    whole = model._states(plan(8, fsdp="full_shard"))
    assert whole == 16 * 180_800 / 8
    assert model._states(plan(8, fsdp="full_shard", tensor_parallel=2, pipeline_parallel=2)) == (
        16 * rank_parameters(llama, 2, 2) / 2)  # 8 ranks = 2 x 2 x dp 2
    gpipe = plan(8, micro_batch_size=2, pipeline_parallel=2, pipeline_schedule="gpipe", grad_accum_steps=8)
    assert activation_units(gpipe) == 2 * 8 / 2 and activation_units(gpipe.replace(pipeline_schedule="1f1b")) == 2
    made = make_config({"micro_batch_size": 2, "pipeline_parallel": 2}, 64, 8, Machine.detect())[0]
    assert made.grad_accum_steps == 8 and activation_units(made) == 2  # 64 = micro 2 x 8 x dp 4 (8 ranks / pp 2)


def test_a_proposer_put_in_the_chain_decides_what_runs_next(toy, tmp_path):
    """Changing the search is writing one proposer (:mod:`tuner.tuning.proposing.proposers`):
    one that wants micro-batch 2 after the baseline gets it measured next, said as its why
    in the study; without it, the guided walk's step comes (the largest micro-batch first)."""
    import tuner
    from tuner.inputs.space import Machine
    from tuner.study.searchspace import build_space
    from tuner.trial.trial_result import State, TrialResult
    from tuner.tuning.decider import Decider
    from tuner.tuning.events import SearchEvents
    from tuner.tuning.proposing.proposers import Proposal

    class Two:
        def propose(self, now):
            if now.best is not None and not now.taken({**now.best.params, "micro_batch_size": 2}):
                return Proposal({**now.best.params, "micro_batch_size": 2}, {"why": "mine: micro-batch 2"})
            return None

    for chain, expected in ((True, 2), (False, 8)):
        recipe = tuner.load_recipe(toy(space={"micro_batch_size": [1, 2, 4, 8]}, baseline={"micro_batch_size": 1},
                                       budget={"trials": 10}, out=str(tmp_path / f"run{chain}"), name=f"p{chain}"))
        machine = Machine.detect()
        decider = Decider(recipe, build_space(recipe, machine), machine, SearchEvents())
        if chain:
            decider.proposers.insert(1, Two())
        assert decider.next(False)["config"].micro_batch_size == 1  # the baseline first, whatever the chain
        metrics = {"samples_per_s": 100.0, "peak_mem_gib": 0.3, "host_mem_gib": 0.3, "data_wait_share": 0.0}
        decider.record(TrialResult(decider.current.params(), State.OK, metrics=metrics, losses=[1.0]))
        micro = decider.next(False)["config"].micro_batch_size
        asked = decider.study.records()[-1]
        assert micro == expected
        assert asked.get("why") == "mine: micro-batch 2" if chain else asked.get("guided") and "mine" not in asked.get(
            "why")
        decider.workers.close()


def test_a_saved_profile_feeds_the_model_only_where_every_trial_makes_a_plan(tmp_path):
    """``tuner plan``'s plan.json starts the search's model from what it measured; one whose
    trials hold a value no knob takes now (an older version's) is passed over, said in a line."""
    import json

    from tuner.memory.model import feed_plan

    model = MemoryModel(P, overhead_bytes=0.3 * GIB, world_size=1, host_is_device=True)
    trial = {"knobs": plan(micro_batch_size=4).params(), "predicted_gib": 0.5, "measured_gib": 0.55, "basis": "fitted"}
    saved = {"recipe": "r.yaml", "parameters": P, "world_size": 1, "profiled": [trial]}
    (tmp_path / "plan.json").write_text(json.dumps(saved))
    assert feed_plan(model, tmp_path, "r.yaml")[0] == 1 and model.observed[0][0] == plan(micro_batch_size=4)
    trial["knobs"]["amp_dtype"] = "bf8"
    (tmp_path / "plan.json").write_text(json.dumps(saved))
    fed, said = feed_plan(MemoryModel(P, 0.3 * GIB, 1, True), tmp_path, "r.yaml")
    assert fed == 0 and said.endswith("holds a trial no plan of this version makes; not used")
