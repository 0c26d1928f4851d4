"""The precision guard: a bf16 configuration whose loss leaves the fp32 curve is rejected."""

from __future__ import annotations

import csv
import math

import tuner
from tuner.analysis.guard import divergence
from tuner.outputs.trial_words import trial_reason


def _trials(out):
    with (out / "trials.csv").open() as f:
        return list(csv.DictReader(f))


def test_divergence_rule():
    ref = [2.0, 1.8, 1.6]
    assert divergence([2.01, 1.79, 1.61], ref, 0.05, "bf16") is None
    why = divergence([2.0, 1.8, 1.9], ref, 0.05, "bf16")  # a record; its words at the edges
    assert why is not None and (why["code"], why["figures"]["step"]) == ("apart", 3)
    said = trial_reason({"ruled": why})
    assert "step 3" in said and "18.7%" in said and "tolerance 5%" in said
    nonfinite = divergence([2.0, math.nan], ref, 0.05, "fp16")
    assert nonfinite == {"code": "nonfinite", "figures": {"amp": "fp16", "step": 2}}
    assert "not finite at step 2" in trial_reason({"ruled": nonfinite})
    assert divergence([2.0, 1.8, 1.6, 9.9], ref, 0.05, "bf16") is None  # only steps both ran


def test_search_rejects_bf16_that_changes_the_loss(toy, tmp_path):
    """The fragile task rounds its logits to multiples of 32 in bf16: fast, and wrong."""
    # The fragile curve leaves fp32 at step 1; a bf16 trial pruned after 2 measured steps
    # (tiny steps are noisy) still carries its curve, so it is imprecise either way.
    recipe = toy(task_args={"fragile": True}, steps={"warmup": 2, "measure": 3}, budget={"trials": 2},
                 space={"amp_dtype": ["fp32", "bf16"]}, baseline={"amp_dtype": "fp32"})
    result = tuner.search(recipe, out=tmp_path / "run", confirm=0, quiet=True)
    rows = {row["amp_dtype"]: row for row in _trials(tmp_path / "run")}
    assert rows["bf16"]["state"] == "imprecise", rows["bf16"]
    assert "precision guard: the bf16 loss" in rows["bf16"]["reason"]
    assert result.best["params"]["amp_dtype"] == "fp32"


def test_bf16_that_keeps_the_loss_passes_and_a_reference_is_run_when_needed(toy, tmp_path):
    """A bf16 baseline: no fp32 trial to compare with yet, so one is run first."""
    recipe = toy(steps={"warmup": 2, "measure": 8}, budget={"trials": 1},
                 space={"amp_dtype": ["fp32", "bf16"]}, baseline={"amp_dtype": "bf16"})
    tuner.search(recipe, out=tmp_path / "run", confirm=0, quiet=True)
    rows = _trials(tmp_path / "run")
    assert [r["amp_dtype"] for r in rows] == ["bf16"] and rows[0]["state"] == "ok"
    assert "measured an fp32 reference curve" in (tmp_path / "run" / "search.log").read_text()


def test_batch_norm_with_another_micro_batch_is_flagged(toy, tmp_path):
    recipe = toy(task_args={"batch_norm": True}, steps={"warmup": 2, "measure": 3}, budget={"trials": 2},
                 space={"micro_batch_size": [16, 8]}, baseline={"micro_batch_size": 16})
    tuner.search(recipe, out=tmp_path / "run", confirm=0, quiet=True)
    assert "BatchNorm layers: their statistics are per micro-batch" in (tmp_path / "run" / "search.log").read_text()


def test_a_pruned_trial_whose_curve_left_the_reference_is_recorded_imprecise(toy, tmp_path):
    """Pruning cuts a bf16 trial after 2 measured steps; what it ran still goes to the guard."""
    from tuner.inputs.space import Machine
    from tuner.study.searchspace import build_space
    from tuner.trial.trial_result import State, TrialResult
    from tuner.tuning.decider import Decider
    from tuner.tuning.events import SearchEvents

    recipe = tuner.load_recipe(toy(space={"amp_dtype": ["fp32", "bf16"]}, out=str(tmp_path / "run")))
    machine = Machine.detect()
    decider = Decider(recipe, build_space(recipe, machine), machine, SearchEvents())
    order = decider.next(False)
    assert order["config"].amp_dtype == "fp32"  # the baseline
    metrics = {"samples_per_s": 100.0, "peak_mem_gib": 0.1, "host_mem_gib": 0.1, "data_wait_share": 0.0}
    decider.record(TrialResult(decider.current.params(), State.OK, metrics=metrics, losses=[2.6, 2.5, 2.4]))
    order = decider.next(False)
    assert order["config"].amp_dtype == "bf16"
    decider.record(TrialResult(decider.current.params(), State.PRUNED, reason="slower than the best so far",
                               losses=[2.6, 1.3], pruned_at=(2, 30.0)))
    last = decider.study.records()[-1]
    assert last.outcome == "imprecise" and last.get("reason") is None, last.attrs  # the record, not words
    assert "precision guard: the bf16 loss 1.3 is 48.0% from the fp32 reference 2.5 at step 2" in \
        trial_reason(last.attrs)
