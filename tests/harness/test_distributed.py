"""Real torchrun ranks on gloo: DDP and DeepSpeed ZeRO 0-3, fp32 and bf16."""

from __future__ import annotations

import json

import pytest

from tuner.harness.metrics import METRIC_NAMES

from conftest import TESTS, torchrun


@pytest.mark.slow
def test_ddp_on_two_ranks_prints_one_json_from_rank_0(toy):
    # a steady 10 ms wait per forward: the auto window's interval narrows within its first second
    recipe = toy(task_args={"read_ms": 0.5, "step_ms": 10}, space={"micro_batch_size": [4, 8]})
    proc = torchrun(2, "-m", "tuner.measure", str(recipe), "--set", "num_workers=1",
                    "--set", "micro_batch_size=4", "--set", "steps.measure=auto", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)  # one document: rank 1 printed nothing
    assert out["state"] == "ok" and out["environment"]["world_size"] == 2
    assert out["params"]["grad_accum_steps"] == 2  # 16 = 4 x 2 ranks x 2
    assert out["params"]["engine"] == "torch"
    assert list(out["metrics"]) == list(METRIC_NAMES)
    assert out["metrics"]["samples_per_s"] > 0
    # an auto window: the ranks agreed when it was long enough (else one would hang)
    assert out["metrics"]["measured_steps"] >= 8 and out["metrics"]["measured_s"] >= 1.0


@pytest.mark.slow  # a real launch (8.6 / 6.2 s): the quick tier stays under 3 minutes
def test_table_is_printed_once_under_torchrun(toy):
    proc = torchrun(2, "-m", "tuner.measure", str(toy()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("step_time_p99_s") == 1


@pytest.mark.slow
def test_recipe_error_under_torchrun_is_reported_once(toy):
    proc = torchrun(2, "-m", "tuner.measure", str(toy(space={"micro_batch_size": [16]})))
    assert proc.returncode != 0
    assert proc.stderr.count("micro_batch_size 16 x world size 2") == 1


@pytest.mark.slow
def test_zero_stages_fp32_bf16_and_isolation(toy, tmp_path):
    """ZeRO 0-3 x fp32/bf16 train under 2 ranks in one process, and measuring them leaves
    nothing behind: the first configuration measured again gives its numbers back."""
    recipe = toy(engine="deepspeed", task_args={"read_ms": 1.0, "width": 256},
                 steps={"warmup": 3, "measure": 10}, space={"micro_batch_size": [4]})
    out = tmp_path / "rows.json"
    proc = torchrun(2, str(TESTS / "helpers" / "zero_stages.py"), str(recipe), str(out))
    assert proc.returncode == 0, proc.stderr[-5000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 9
    for row in rows:
        assert row["state"] == "ok", row
        assert row["params"]["engine"] == "deepspeed" and row["world_size"] == 2
        assert row["params"]["zero_stage"] == row["knobs"]["zero_stage"]
        assert row["params"]["amp_dtype"] == row["knobs"]["amp_dtype"]
        assert row["live_parameters"] == 0, row  # no model survives its trial
        assert row["linear_restored"], row  # ZeRO-3's patch of F.linear is undone
    assert len({row["process_groups"] for row in rows}) == 1  # no trial leaves a group behind
    first, again = rows[0]["metrics"], rows[-1]["metrics"]
    ratio = again["samples_per_s"] / first["samples_per_s"]
    assert 0.5 < ratio < 2.0, ratio
    assert again["peak_mem_gib"] <= first["peak_mem_gib"] * 1.10, (first["peak_mem_gib"], again["peak_mem_gib"])


@pytest.mark.slow
def test_rank_0_says_its_refusal_before_any_rank_exits(tmp_path):
    """The first rank to exit has torchrun end the others: a loaded CI run lost a refusal's
    one line when rank 1 exited before rank 0 printed it. Here rank 0 is 3 s late on purpose,
    before any process group exists, and its line is still said."""
    script = tmp_path / "refuse.py"
    script.write_text(
        "import os, sys, time\nfrom tuner.harness import distributed\n"
        "if os.environ['RANK'] == '0':\n    time.sleep(3)\n    print('error: refused', file=sys.stderr, flush=True)\n"
        "distributed.leave_after_rank_0('tuner/error/said')\nsys.exit(2)\n")
    proc = torchrun(2, str(script))
    assert proc.returncode != 0
    assert proc.stderr.count("error: refused") == 1, proc.stderr[-2000:]
