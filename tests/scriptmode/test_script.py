"""``tuner.config`` and the probe as a training script sees them, with and without the tuner."""

from __future__ import annotations

import json

import pytest
import torch

import tuner
from tuner.harness.metrics import METRIC_NAMES


def test_outside_the_tuner_the_scripts_defaults_come_back(monkeypatch):
    monkeypatch.delenv("TUNER_TRIAL", raising=False)
    cfg = tuner.config(num_workers=2, amp_dtype="bf16", micro_batch_size=8, global_batch_size=64)
    assert not cfg.tuned
    assert (cfg.num_workers, cfg.amp_dtype, cfg.micro_batch_size) == (2, "bf16", 8)
    assert cfg.grad_accum_steps == 8 and cfg.zero_stage == 0 and cfg.prefetch_factor == 2  # tuner defaults
    assert cfg.dataloader_kwargs() == {"batch_size": 8, "num_workers": 2, "pin_memory": False,
                                       "prefetch_factor": 2, "persistent_workers": False}
    assert cfg.accelerate_kwargs() == {"mixed_precision": "bf16", "gradient_accumulation_steps": 8}
    assert cfg.ddp_kwargs() == {"bucket_cap_mb": 25, "gradient_as_bucket_view": False, "static_graph": False}
    viewed = tuner.config(gradient_as_bucket_view=True, ddp_bucket_cap_mb=50, micro_batch_size=8)
    assert viewed.ddp_kwargs() == {"bucket_cap_mb": 50, "gradient_as_bucket_view": True, "static_graph": False}


def test_tuner_config_is_a_plain_function_beside_the_inputs_package():
    """``tuner.config(**defaults)`` is a function and the user's input is the package
    ``tuner.inputs``: both reachable whichever is imported first (the package was named
    ``tuner.config`` and made callable by swapping its module class)."""
    import inspect
    import subprocess
    import sys

    import tuner.inputs.space

    assert inspect.isfunction(tuner.config) and tuner.config(num_workers=3).num_workers == 3
    assert tuner.inputs.space.LEVERS["num_workers"]
    from tuner import config

    assert config is tuner.config and config(amp_dtype="bf16").amp_dtype == "bf16"
    code = ("import tuner.inputs.recipe, tuner; from tuner.outputs import exports; "
            "print(tuner.inputs.recipe.load_recipe.__name__, tuner.config(micro_batch_size=4).micro_batch_size)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["load_recipe", "4"]


def test_under_the_tuner_the_trials_knobs_win(monkeypatch, tmp_path):
    trial = tmp_path / "trial.json"
    trial.write_text(json.dumps({"knobs": {"num_workers": 4, "micro_batch_size": 4, "zero_stage": 2},
                                 "global_batch_size": 32, "warmup": 2, "measure": 5}))
    monkeypatch.setenv("TUNER_TRIAL", str(trial))
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = tuner.config(num_workers=1, micro_batch_size=16, global_batch_size=64)
    assert cfg.tuned and cfg.num_workers == 4 and cfg.micro_batch_size == 4 and cfg.global_batch_size == 32
    assert cfg.grad_accum_steps == 4  # 32 / (4 x 2 ranks)
    args = cfg.hf_training_args()
    assert args["per_device_train_batch_size"] == 4 and args["gradient_accumulation_steps"] == 4
    assert args["deepspeed"]["zero_optimization"]["stage"] == 2


def test_ds_config_keeps_the_users_settings_and_sets_the_tuned_ones(tmp_path, monkeypatch):
    monkeypatch.delenv("TUNER_TRIAL", raising=False)
    base = {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "train_batch_size": 999,
            "zero_optimization": {"stage": 0, "overlap_comm": True}, "bf16": {"enabled": False}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(base))
    cfg = tuner.config(amp_dtype="bf16", micro_batch_size=4, zero_stage=1, global_batch_size=16)
    for given in (base, path):
        out = cfg.ds_config(given)
        assert out["optimizer"] == base["optimizer"]
        assert out["train_batch_size"] == 16 and out["train_micro_batch_size_per_gpu"] == 4
        assert out["gradient_accumulation_steps"] == 4
        assert out["zero_optimization"] == {"stage": 1, "overlap_comm": True}
        assert out["bf16"] == {"enabled": True} and out["fp16"] == {"enabled": False}
    assert base["train_batch_size"] == 999  # the caller's dict is not changed
    with pytest.raises(ValueError, match="cannot read"):
        cfg.ds_config(tmp_path / "missing.json")


def test_bad_defaults_say_what_is_wrong(monkeypatch):
    monkeypatch.delenv("TUNER_TRIAL", raising=False)
    with pytest.raises(TypeError, match="unknown knob.*num_worker.*knobs are num_workers"):
        tuner.config(num_worker=2)
    with pytest.raises(ValueError, match="global_batch_size 10 is not divisible by micro_batch_size 4"):
        tuner.config(micro_batch_size=4, global_batch_size=10)
    with pytest.raises(ValueError, match=r"^tuner.config\(\): amp_dtype: 'bf8' is not a value it takes \('fp32' \| "):
        tuner.config(amp_dtype="bf8")


def test_probe_under_the_tuner_uses_the_trials_window_and_reports(monkeypatch, tmp_path):
    result = tmp_path / "result.json"
    trial = tmp_path / "trial.json"
    trial.write_text(json.dumps({"knobs": {"micro_batch_size": 4}, "global_batch_size": 4, "warmup": 2,
                                 "measure": 5, "result": str(result)}))
    monkeypatch.setenv("TUNER_TRIAL", str(trial))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    probe = tuner.Probe(warmup=100, measure=1000)  # the script's own window: the tuner's wins
    steps = 0
    for _batch in probe.loader([torch.zeros(4, 3)] * 50):
        probe.step()
        steps += 1
        if probe.done:
            break
    assert steps == 7
    reported = json.loads(result.read_text())
    assert list(reported["metrics"]) == list(METRIC_NAMES) and reported["metrics"]["samples_per_s"] > 0
    unmeasured = [] if reported["metrics"]["energy_j_per_sample"] else ["energy_j_per_sample"]
    assert reported["notes"] == [] and list(reported["unmeasured"]) == unmeasured  # never a 0 without a word


def test_a_script_that_does_not_apply_the_accumulation_is_stopped(monkeypatch, tmp_path):
    """Global batch 16 with micro-batch 4 means 4 micro-batches per optimizer step; a
    script stepping on every batch reports another configuration: it stops, saying so."""
    trial = tmp_path / "trial.json"
    trial.write_text(json.dumps({"knobs": {"micro_batch_size": 4}, "global_batch_size": 16, "warmup": 2,
                                 "measure": 5, "result": str(tmp_path / "result.json")}))
    monkeypatch.setenv("TUNER_TRIAL", str(trial))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    probe = tuner.Probe()
    batches = probe.loader([torch.zeros(4, 3)] * 50)
    next(batches)
    probe.step()
    next(batches)
    with pytest.raises(RuntimeError, match=r"second optimizer step took 4 samples on this rank, but its "
                       r"configuration needs 16 \(global batch 16 / 1 rank\(s\) = micro-batch 4 x 4"):
        probe.step()
    assert not (tmp_path / "result.json").exists()



def test_only_the_levers_the_recipe_tunes_replace_the_scripts_own(monkeypatch, tmp_path):
    trial = tmp_path / "trial.json"
    trial.write_text(json.dumps({
        "knobs": {"micro_batch_size": 4, "zero_stage": 2, "compile": True, "overlap_comm": True,
                  "activation_checkpointing": "none", "reduce_bucket_size": 1000},
        "given": ["micro_batch_size", "zero_stage", "compile", "overlap_comm", "activation_checkpointing"],
        "global_batch_size": 16, "warmup": 2, "measure": 5}))
    monkeypatch.setenv("TUNER_TRIAL", str(trial))
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg = tuner.config(global_batch_size=16)
    assert cfg.compile and cfg.overlap_comm and cfg.fsdp == "off"
    args = cfg.hf_training_args()
    assert args["torch_compile"] is True
    assert args["activation_checkpointing"] is False  # tuned, and off in this trial: said explicitly
    assert "optim" not in args and "ddp_bucket_cap_mb" not in args and "fsdp" not in args  # not tuned: the script's
    zero = cfg.ds_config({"zero_optimization": {"stage": 0, "reduce_bucket_size": 77}})["zero_optimization"]
    assert zero == {"stage": 2, "reduce_bucket_size": 77, "overlap_comm": True}  # the untuned bucket is the script's


def test_a_tuned_offload_keeps_the_scripts_own_offload_keys(monkeypatch, tmp_path):
    """The script's ``offload_optimizer`` block (its buffer count, its own pin_memory) is
    merged with the tuned device, not replaced; and the tuned block keeps the script's
    optimizer, as the trial did (DeepSpeed would otherwise demand its CPU Adam)."""
    trial = tmp_path / "trial.json"
    trial.write_text(json.dumps({
        "knobs": {"micro_batch_size": 4, "zero_stage": 2, "offload_optimizer": "cpu"},
        "given": ["micro_batch_size", "zero_stage", "offload_optimizer"],
        "global_batch_size": 16, "warmup": 2, "measure": 5}))
    monkeypatch.setenv("TUNER_TRIAL", str(trial))
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg = tuner.config(global_batch_size=16)
    own = {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "none", "buffer_count": 8,
                                                                   "pin_memory": True}}}
    out = cfg.ds_config(own)
    assert out["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "buffer_count": 8, "pin_memory": True}
    assert out["zero_force_ds_cpu_optimizer"] is False
    plain = cfg.ds_config({})["zero_optimization"]["offload_optimizer"]
    assert plain == {"device": "cpu", "pin_memory": torch.cuda.is_available()}  # pinned exactly where CUDA runs


def test_what_a_script_s_own_loader_keeps_is_compared_where_it_acts():
    """imagenet/main.py pins with no workers at a trial of 0: ``pin_memory`` acts there (the
    main process pins) and is recorded as what ran; ``prefetch_factor`` does not act without
    workers and is not. With workers every loader lever the trial left alone is compared."""
    from torch.utils.data import DataLoader

    from tuner.inputs.levers import LEVERS
    from tuner.scriptmode.adapters.common import kept_by_script

    knobs = {n: LEVERS[n].default for n in LEVERS}  # what a trial's file holds: every lever
    data = list(range(8))
    assert kept_by_script(DataLoader(data, pin_memory=True), knobs) == {"pin_memory": True}
    assert kept_by_script(DataLoader(data), knobs) == {}
    workers = DataLoader(data, num_workers=2, prefetch_factor=4, persistent_workers=True)
    assert kept_by_script(workers, knobs) == {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True}
    assert kept_by_script(workers, {**knobs, "num_workers": 2, "prefetch_factor": 4}) == {"persistent_workers": True}
    assert kept_by_script(DataLoader(data, pin_memory=True), {"num_workers": 0}) == {}  # only knobs the trial set


@pytest.mark.slow
def test_a_loader_setting_the_script_sets_itself_is_recorded_as_what_ran(tmp_path):
    """The script builds its DataLoader with no workers whatever the trial says: the trial of
    ``num_workers=2`` ran none, and trials.csv, best.json, report.md and dataloader.json say
    the loader that ran, and that the script set it (it was not searched)."""
    import csv

    from conftest import TESTS, write_recipe

    recipe = write_recipe(tmp_path, {
        "name": "own-loader", "script": str(TESTS / "helpers" / "own_loader.py"), "launcher": "python",
        "global_batch_size": 8, "steps": {"warmup": 2, "measure": 8}, "out": str(tmp_path / "run"),
        "baseline": {"num_workers": 0}, "space": {"num_workers": [0, 2]}})
    tuner.search(recipe, trials=2, confirm=0, attribute=0, quiet=True)
    with open(tmp_path / "run" / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    asked_two = [r for r in rows if r["set_by_script"]]
    assert len(asked_two) == 1 and asked_two[0]["num_workers"] == "0" and asked_two[0]["set_by_script"] == "num_workers"
    plain = [r for r in rows if not r["set_by_script"]]
    assert len(plain) == 1 and plain[0]["num_workers"] == "0"
    assert json.loads((tmp_path / "run" / "dataloader.json").read_text())["num_workers"] == 0  # whichever won
    only = write_recipe(tmp_path, {  # the answer itself asked for 2 workers: what is pasted is what ran
        "name": "own-loader-2", "script": str(TESTS / "helpers" / "own_loader.py"), "launcher": "python",
        "global_batch_size": 8, "steps": {"warmup": 2, "measure": 8}, "out": str(tmp_path / "two"),
        "baseline": {"num_workers": 2}, "space": {"num_workers": [2]}}, name="two.yaml")
    tuner.search(only, trials=1, confirm=0, attribute=0, quiet=True)
    best = json.loads((tmp_path / "two" / "best.json").read_text())
    assert best["params"]["num_workers"] == 2 and best["ran"] == {"num_workers": 0}
    assert json.loads((tmp_path / "two" / "dataloader.json").read_text())["num_workers"] == 0
    report = (tmp_path / "two" / "report.md").read_text()
    assert "Set by the script itself and not searched" in report and '"num_workers": 0' in report
