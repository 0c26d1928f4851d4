"""The search with the new levers: checkpointing buys the micro-batch that did not fit,
and the sampler never proposes FSDP2 with ZeRO."""

from __future__ import annotations

import csv

import optuna
import pytest

import tuner
from tuner.inputs.rules import conflict
from tuner.inputs.space import Configs, Machine
from tuner.study.searchspace import Space, suggest
from tuner.study.study import Asked

from conftest import TESTS, write_recipe

pytestmark = pytest.mark.slow

ACTIVATIONS = str(TESTS.parent / "recipes" / "tasks" / "activations.py")


def _recipe(folder, **fields):
    body = {"name": "acts", "task": ACTIVATIONS, "task_args": {"dim": 8, "hidden": 32768, "layers": 4, "dequant": 16},
            "global_batch_size": 256, "steps": {"warmup": 1, "measure": 3}, "baseline": {"micro_batch_size": 16}}
    body.update(fields)
    return write_recipe(folder, body)


@pytest.mark.alone
def test_checkpointing_fits_the_fast_micro_batch_the_budget_refused(tmp_path):
    """Activations dominate this job's memory. Measured first, independently: micro-batch
    256 without checkpointing is over a budget set between it and what fits (16, or 256
    with every block checkpointed). The search must then end on checkpointed 256, faster
    than everything inside the budget without checkpointing, and the report say why."""
    plain = _recipe(tmp_path)
    small = tuner.measure(plain, micro_batch_size=16)
    large = tuner.measure(plain, micro_batch_size=256)
    checkpointed = tuner.measure(plain, micro_batch_size=256, activation_checkpointing="full")
    peaks = [m.metrics["peak_mem_gib"] for m in (small, large, checkpointed)]
    fits = max(peaks[0], peaks[2])
    assert peaks[1] - fits > 0.1, peaks  # activations dominate: 256 without checkpointing holds far more
    budget = fits + 0.5 * (peaks[1] - fits)
    recipe = _recipe(tmp_path, budget={"memory_gib": round(budget, 3), "trials": 4},
                     space={"micro_batch_size": [16, 256], "activation_checkpointing": ["none", "full"]})
    out = tmp_path / "run"
    result = tuner.search(recipe, out=out, confirm=1, attribute=1, quiet=True)
    best = result.best
    assert best["params"]["micro_batch_size"] == 256 and best["params"]["activation_checkpointing"] == "full", best
    assert best["metrics"]["peak_mem_gib"] <= budget
    with open(out / "trials.csv", newline="") as f:
        trials = [r for r in csv.DictReader(f)]
    plain_inside = [float(r["samples_per_s"]) for r in trials if r["activation_checkpointing"] == "none"
                    and r["state"] == "ok"]
    # The best is the confirmation's interleaved median; a plain configuration's figure is its
    # one search trial. With dequant 16 (the weights re-derived 16 times a micro-batch),
    # checkpointed 256 runs 2.3-2.7x micro-batch 16 here (4 runs); with 8 it ran 1.07-1.6x
    # and a search once kept 16 (seen twice in 7 runs), so the ranking rests on the job, not
    # on the machine's moment. The single trial still gets the noise of one run (0.8x).
    assert plain_inside and best["metrics"]["samples_per_s"] > 0.8 * max(plain_inside), (best["metrics"], plain_inside)
    over = [r for r in trials if r["micro_batch_size"] == "256" and r["activation_checkpointing"] == "none"]
    assert over and over[0]["state"] == "over_budget", over
    assert float(best["metrics"]["recompute_share"]) > 0  # what checkpointing costs, in the metrics
    log = (out / "search.log").read_text()
    assert "micro_batch_size 256 did not fit (over_budget): activation_checkpointing full" in log
    report = (out / "report.md").read_text()
    assert "activation_checkpointing" in report and "over_budget" in report
    assert "recompute" in report  # the attribution's risk note says what checkpointing costs
    # every trial's peak was predicted before it ran: analytic at first, from the fit once two
    # micro-batches were seen (``prior`` for a checkpointing mode not measured yet). Seen here:
    # analytic 34% and 27% off, fitted 1% and 22% (micro-batch 16's 2 MiB tensors sit on
    # glibc's heap, which a model of live tensors does not see).
    by_number = {t.number: t.get("prediction") for t in result.study.records()}
    basis = [by_number[int(r["number"])] for r in trials]  # the measured trials, in order
    assert basis[0] == "analytic" and set(basis[2:]) <= {"fitted", "prior"}, basis
    ran = [r for r in trials if r["state"] != "pruned"]  # a pruned trial (16 with checkpointing, at times) has no peak
    errors = [abs(float(r["predicted_peak_gib"]) - float(r["peak_mem_gib"])) / float(r["peak_mem_gib"])
              for r in ran if r["peak_mem_gib"]]
    # (16, full), when it is not pruned, is predicted 45% high: with dequant 16 this job's saved
    # tensors at micro-batch 16 are mostly the dequantized weights, whatever the micro-batch
    # (measured in one process: 16 plain 0.75 GiB, 16 full 0.50, 256 full 0.68), which a model
    # of activations growing with the micro-batch cannot see; it passed only when pruned.
    assert len(errors) == len(ran) and errors[2] <= 0.4, errors
    # the result's settled error is the one trials.csv shows after the first three (the
    # fourth, (16, full), is at times pruned, timing: then nothing is settled, and says so)
    settled = errors[3:]
    assert result.memory_prediction["trials"] == len(settled), (result.memory_prediction, errors)
    if settled:
        assert result.memory_prediction["worst"] == pytest.approx(max(settled), rel=1e-3)
    else:
        assert result.memory_prediction["worst"] is None


def test_the_sampler_never_proposes_fsdp_with_zero_or_offload_without_sharding():
    space = Space({"num_workers": (0,), "prefetch_factor": (2,), "pin_memory": (False,),
                   "persistent_workers": (False,), "amp_dtype": ("fp32",), "micro_batch_size": (4, 8),
                   "zero_stage": (0, 1, 2), "fsdp": ("off", "full_shard"), "offload_optimizer": ("none", "cpu"),
                   "ddp_bucket_cap_mb": (25, 100), "overlap_comm": (False, True)})
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(120):
        trial = study.ask()
        knobs = suggest(Asked(trial), space, {}, world_size=2)
        assert conflict(knobs) is None, knobs
        assert not (knobs["zero_stage"] == 0 and knobs["overlap_comm"]), knobs  # DeepSpeed's knob, only for ZeRO
        assert not (knobs["zero_stage"] > 0 and knobs["ddp_bucket_cap_mb"] != 25), knobs  # DDP's, only for DDP
        seen.add((knobs["zero_stage"], knobs["fsdp"], knobs["offload_optimizer"]))
        study.tell(trial, 1.0)
    assert (0, "full_shard", "cpu") in seen and (2, "off", "cpu") in seen and (0, "off", "none") in seen
    assert len(Space(space.choices, make=Configs(16, 2, Machine(cuda=False, bf16=True, fp16=False))).configs()) == 2 * (
        1 * 2 * 1          # DDP: buckets
        + 2 * 2 * 2        # ZeRO 1-2: offload x overlap
        + 2                # FSDP2: offload
    )
