"""The baseline of a script search is what the script runs by itself (issue 25, item 7):
read from its library before any trial, taken where the recipe says nothing, and one line
wherever the recipe says otherwise."""

from __future__ import annotations

import csv
import json

import pytest

import tuner
from tuner.scriptmode import launcher
from tuner.scriptmode.baseline import merge

from conftest import ROOT, TESTS, write_recipe

pytestmark = pytest.mark.slow

HF_ARGS = ["--max_steps", "100000", "--use_cpu", "--report_to", "none", "--save_strategy", "no",
           "--logging_strategy", "no", "--disable_tqdm", "true", "--latency_ms", "3"]


def _look(tmp_path, body):
    tmp_path.mkdir(parents=True, exist_ok=True)
    recipe = tuner.load_recipe(write_recipe(tmp_path, {"steps": {"warmup": 2, "measure": 6}, "timeout_s": 120,
                                                       "out": str(tmp_path / "run"), **body}))
    own, why = launcher.look(recipe, tmp_path / "look")
    assert own is not None, why
    return own


def test_a_trainer_script_run_as_its_user_runs_it_is_the_baseline(tmp_path):
    """The issue's case: a Trainer script run with --per_device_train_batch_size 8 under a
    recipe whose global batch is 32. The baseline is the script's micro-batch and loader
    workers (not the recipe's 32 x 1 and no workers), and one line says that the script by
    itself runs a global batch of 8, with what to set; the reading is kept for a resume."""
    recipe = write_recipe(tmp_path, {
        "name": "hfown", "script": str(TESTS / "helpers" / "hf_train.py"), "adapt": "hf",
        "args": ["--output_dir", str(tmp_path / "out"), *HF_ARGS, "--per_device_train_batch_size", "8",
                 "--dataloader_num_workers", "2"],
        "global_batch_size": 32, "steps": {"warmup": 2, "measure": 6}, "timeout_s": 120,
        "out": str(tmp_path / "run"), "space": {"num_workers": [0, 2], "micro_batch_size": [32, 8]},
    })
    tuner.search(recipe, trials=1, confirm=0, attribute=0, quiet=True)
    with (tmp_path / "run" / "trials.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert (row["micro_batch_size"], row["grad_accum_steps"], row["num_workers"]) == ("8", "4", "2"), row
    assert row["state"] == "ok", row["reason"]
    log = (tmp_path / "run" / "search.log").read_text()
    assert "the script by itself runs a global batch of 8 (micro-batch 8 x 1 accumulation step(s) x 1 rank(s), " \
           "from TrainingArguments)" in log and "set global_batch_size: 8" in log, log
    assert "baseline = the script's own configuration: micro_batch_size=8, num_workers=2" in log, log
    kept = json.loads((tmp_path / "run" / "own.json").read_text())
    assert kept["values"]["micro_batch_size"] == 8 and kept["where"]["num_workers"] == "TrainingArguments"
    assert "the script's own configuration" in (tmp_path / "run" / "trials" / "own" / "output.log").read_text()


def test_a_plain_loop_is_read_from_its_loader_its_steps_and_its_autocast(tmp_path):
    """adapt: torch: the micro-batch and workers of the DataLoader that fed the first step,
    the micro-batches between two optimizer steps (accumulation), the autocast dtype."""
    own = _look(tmp_path, {"name": "flags", "script": str(TESTS / "helpers" / "flags_train.py"), "adapt": "torch",
                           "args": ["--batch-size", "4", "--grad-accum-steps", "2", "--workers", "1",
                                    "--amp-dtype", "bfloat16", "--eval-first"],
                           "global_batch_size": 8})
    values = own["values"]
    assert (values["micro_batch_size"], values["grad_accum_steps"], values["num_workers"],
            values["amp_dtype"]) == (4, 2, 1, "bf16"), own


def test_a_lightning_trainer_and_a_deepspeed_config_are_read_where_their_library_decides(tmp_path):
    lit = _look(tmp_path / "lit", {"name": "lit", "script": str(TESTS / "helpers" / "lightning_train.py"),
                                   "adapt": "lightning", "global_batch_size": 16})
    assert (lit["values"]["micro_batch_size"], lit["values"]["grad_accum_steps"], lit["values"]["amp_dtype"],
            lit["values"]["zero_stage"]) == (16, 1, "fp32", 0), lit
    assert lit["where"]["amp_dtype"] == "the Lightning Trainer"
    ds = _look(tmp_path / "ds", {"name": "ds", "script": str(ROOT / "recipes" / "scripts" / "train_deepspeed.py"),
                                 "adapt": "deepspeed", "global_batch_size": 32, "nproc_per_node": 2,
                                 "args": ["--deepspeed_config", "ds_config.json", "--latency-ms", "0"]})
    config = json.loads((ROOT / "recipes" / "scripts" / "ds_config.json").read_text())
    assert ds["values"]["micro_batch_size"] == config["train_micro_batch_size_per_gpu"], ds
    assert ds["values"]["zero_stage"] == config.get("zero_optimization", {}).get("stage", 0)
    assert ds["where"]["num_workers"].startswith("the first DataLoader iterated"), ds


def _recipe(tmp_path, **fields):
    body = {"name": "m", "script": str(TESTS / "helpers" / "flags_train.py"), "adapt": "torch",
            "global_batch_size": 16, "out": str(tmp_path / "run"),
            "knobs": {"micro_batch_size": "--batch-size {}", "grad_accum_steps": "--grad-accum-steps {}"},
            "space": {"micro_batch_size": [16, 8]}, **fields}
    return tuner.load_recipe(write_recipe(tmp_path, body))


def test_what_the_recipe_says_wins_and_is_said(tmp_path):
    recipe = _recipe(tmp_path, baseline={"num_workers": 0})
    own = {"values": {"micro_batch_size": 8, "grad_accum_steps": 2, "num_workers": 4, "amp_dtype": "bf16"},
           "where": {"micro_batch_size": "X", "num_workers": "X", "amp_dtype": "Y"}}
    merged, lines = merge(recipe, own)
    assert merged.baseline == {"micro_batch_size": 8, "amp_dtype": "bf16", "num_workers": 0}
    assert any("the recipe's baseline: sets num_workers 0 (the script's own: 4)" in line for line in lines), lines
    assert not any("global batch" in line for line in lines), lines


@pytest.mark.parametrize(("values", "kept", "said"), [
    ({"micro_batch_size": 5, "grad_accum_steps": 1}, {}, "runs a global batch of 5"),  # 16 % 5: not a micro-batch
    ({"num_workers": -3}, {}, "is not a value the tuner runs"),
    ({"zero_stage": 2, "fsdp": "full_shard"}, {}, "cannot be the baseline"),
])
def test_what_cannot_be_the_baseline_is_left_with_a_line(tmp_path, values, kept, said):
    recipe = _recipe(tmp_path)
    merged, lines = merge(recipe, {"values": values, "where": {}})
    assert merged.baseline == kept and any(said in line for line in lines), lines


def test_an_override_is_never_replaced(tmp_path):
    recipe = tuner.load_recipe(write_recipe(tmp_path, {
        "name": "m", "script": str(TESTS / "helpers" / "flags_train.py"), "adapt": "torch",
        "global_batch_size": 16, "out": str(tmp_path / "run")}), overrides=["num_workers=1"])
    merged, _ = merge(recipe, {"values": {"num_workers": 3}, "where": {}})
    assert "num_workers" not in merged.baseline and merged.knob_overrides == {"num_workers": 1}


def test_the_minutes_count_the_look_at_the_scripts_own_configuration(tmp_path):
    """``budget.minutes`` bounds the whole command: the look run before the first trial
    counts (word_language_model's look ran 71 s outside a 2-minute budget). Here the look
    sleeps 5 s; the search's recorded wall time holds it and the trial both."""
    script = tmp_path / "train.py"
    script.write_text(
        "import json, os, time\nimport torch\n"
        "if json.load(open(os.environ['TUNER_TRIAL'])).get('look'):\n    time.sleep(5)\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = torch.utils.data.TensorDataset(torch.randn(8192, 4))\n"
        "for (x,) in torch.utils.data.DataLoader(data, batch_size=16):\n"
        "    model(x).sum().backward()\n    opt.step()\n    opt.zero_grad()\n")
    recipe = write_recipe(tmp_path, {"name": "look", "script": str(script), "adapt": "torch",
                                     "global_batch_size": 16, "steps": {"warmup": 2, "measure": 10},
                                     "out": str(tmp_path / "run")})
    tuner.search(recipe, trials=1, confirm=0, attribute=0, quiet=True)
    wall = json.loads((tmp_path / "run" / "best.json").read_text())["wall_s"]
    with (tmp_path / "run" / "trials.csv").open() as f:
        trial = sum(float(r["duration_s"]) for r in csv.DictReader(f))
    assert wall >= 5.0 + trial, (wall, trial)
