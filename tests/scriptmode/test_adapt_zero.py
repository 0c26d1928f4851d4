"""adapt: hf and adapt: lightning with a ZeRO stage (issue 25, item 6): the Trainer's own
``deepspeed`` argument and Lightning's DeepSpeed strategy, through the adapters."""

from __future__ import annotations

import json

import pytest

import tuner
from tuner.inputs.machine import Machine
from tuner.study.searchspace import build_space

from conftest import TESTS, write_recipe

pytestmark = pytest.mark.slow

pytest.importorskip("deepspeed")


def test_a_trainer_script_runs_zero_3_in_bf16_through_its_own_deepspeed_argument(tmp_path):
    """Two ranks on gloo: the trial's stage and precision reach the Trainer through
    TrainingArguments.deepspeed; the script's own callback prints what its first step ran on
    (DeepSpeed's stage-3 optimizer, on both ranks), and the engine's collectives are timed."""
    recipe = write_recipe(tmp_path, {
        "name": "hfzero", "script": str(TESTS / "helpers" / "hf_train.py"), "adapt": "hf",
        "args": ["--output_dir", str(tmp_path / "out"), "--max_steps", "100000", "--use_cpu", "--report_to", "none",
                 "--save_strategy", "no", "--logging_strategy", "no", "--disable_tqdm", "true", "--latency_ms", "1",
                 "--per_device_train_batch_size", "8"],
        "nproc_per_node": 2, "global_batch_size": 16, "steps": {"warmup": 2, "measure": 6}, "timeout_s": 240,
        "out": str(tmp_path / "run"), "space": {"zero_stage": [0, 3], "amp_dtype": ["fp32", "bf16"]},
    })
    m = tuner.measure(recipe, zero_stage=3, amp_dtype="bf16")
    assert m.state == "ok", m.reason
    log = (tmp_path / "run" / "measure" / "trials" / "001" / "output.log").read_text()
    assert log.count("engine: DeepSpeedZeroOptimizer_Stage3, zero stage 3, bf16 True") == 2, log[-3000:]
    assert m.metrics["comm_share"] > 0 and m.params["zero_stage"] == 3
    trial = json.loads((tmp_path / "run" / "measure" / "trials" / "001" / "trial.json").read_text())
    assert trial["knobs"]["zero_stage"] == 3


def test_lightning_gets_its_deepspeed_strategy_and_a_cpu_search_drops_it_in_one_line(tmp_path):
    """Lightning's DeepSpeed strategy refuses any accelerator but CUDA (its own check at
    setup), so on CPU the arguments are checked on a real Trainer, and a search leaves the
    stages out before any trial, saying why; on a GPU node the same recipe searches them."""
    pl = pytest.importorskip("lightning.pytorch")
    from tuner.scriptmode.adapters.lightning import trainer_arguments

    cfg = tuner.config(global_batch_size=32, micro_batch_size=8, zero_stage=2, amp_dtype="bf16")
    kwargs = trainer_arguments(cfg, {"accelerator": "cpu", "logger": False, "strategy": "auto"}, zero_searched=True)
    trainer = pl.Trainer(**kwargs, enable_progress_bar=False, enable_model_summary=False)
    assert type(trainer.strategy).__name__ == "DeepSpeedStrategy"
    assert trainer.strategy.config["zero_optimization"]["stage"] == 2
    assert (trainer.accumulate_grad_batches, str(trainer.precision)) == (4, "bf16-mixed")

    recipe = tuner.load_recipe(write_recipe(tmp_path, {
        "name": "litzero", "script": str(TESTS / "helpers" / "lightning_train.py"), "adapt": "lightning",
        "global_batch_size": 16, "out": str(tmp_path / "run"), "space": {"zero_stage": [0, 2, 3]}}))
    machine = Machine.detect()
    space = build_space(recipe, machine)
    if machine.cuda:
        assert space.choices["zero_stage"] == (0, 2, 3)
        return
    assert space.choices["zero_stage"] == (0,)
    assert any("zero_stage=2 dropped: Lightning's DeepSpeed strategy runs only on CUDA GPUs" in n
               for n in space.notes), space.notes
