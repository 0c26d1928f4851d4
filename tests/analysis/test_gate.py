"""``python -m tuner.check``: the regression gate, against its own result and altered ones."""

from __future__ import annotations

import json
import sys

import pytest

import tuner

from conftest import run, toy_recipe


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A small real search on the toy task: its recipe and run folder."""
    folder = tmp_path_factory.mktemp("check")
    recipe = toy_recipe(folder, task_args={"read_ms": 0.5}, steps={"warmup": 2, "measure": 20},
                        space={"num_workers": [0, 2]}, budget={"trials": 2})
    result = tuner.search(recipe, out=folder / "run", confirm=1, quiet=True)
    assert result is not None and result.best["metrics"]
    return recipe, folder / "run"


def _altered(run_dir, tmp_path, change):
    best = json.loads((run_dir / "best.json").read_text())
    change(best)
    path = tmp_path / "best.json"
    path.write_text(json.dumps(best))
    return path


def check(*args):
    return run([sys.executable, "-m", "tuner.check", *map(str, args)])


def test_passes_against_its_own_result(recorded):
    recipe, run_dir = recorded
    # A wide tolerance: one process to the next varies 30-50% on this machine.
    proc = check(recipe, "--against", run_dir / "best.json", "--tolerance", "0.5", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["passed"] and len(out["repeats"]) == 3
    assert out["spread"][0] <= out["measured_samples_per_s"] <= out["spread"][1]


def test_fails_against_a_result_inflated_three_times(recorded, tmp_path):
    recipe, run_dir = recorded

    def inflate(best):
        best["metrics"]["samples_per_s"] *= 3

    proc = check(recipe, "--against", _altered(run_dir, tmp_path, inflate), "--tolerance", "0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "regression" in proc.stdout and "recorded" in proc.stdout


@pytest.mark.parametrize("key, value, says", [
    ("device", "NVIDIA H200", "device: recorded 'NVIDIA H200'"),
    ("world_size", 8, "world size: recorded 8, here 1"),
])
def test_refuses_a_result_from_another_environment(recorded, tmp_path, key, value, says):
    recipe, run_dir = recorded

    def move(best):
        best["environment"][key] = value

    proc = check(recipe, "--against", _altered(run_dir, tmp_path, move))
    assert proc.returncode == 2
    assert says in proc.stderr and "Traceback" not in proc.stderr


def test_refuses_what_it_cannot_check(recorded, tmp_path):
    recipe, run_dir = recorded
    missing = check(recipe, "--against", tmp_path / "nope")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    empty = _altered(run_dir, tmp_path, lambda best: best.update(params=None))
    proc = check(recipe, "--against", empty)
    assert proc.returncode == 2 and "no successful configuration" in proc.stderr
    bad = check(recipe, "--against", run_dir, "--tolerance", "1.5")
    assert bad.returncode == 2 and "--tolerance must be in [0, 1)" in bad.stderr
    other_batch = check(recipe, "--against", run_dir, "--set", "global_batch_size=32")
    assert other_batch.returncode == 2 and "global_batch_size is 32" in other_batch.stderr


def test_the_verdict_is_a_pure_function_of_the_rates():
    from tuner.analysis.gate import verdict

    ok = verdict(100.0, [96.0, 99.0, 97.0], 3, 0.05, {}, "ok", None)
    assert ok.passed and ok.measured == 97.0 and ok.spread == [96.0, 99.0]
    slow = verdict(100.0, [80.0, 90.0], 2, 0.05, {}, "ok", None)
    assert not slow.passed and slow.reason.startswith("regression: 85.0 < 95.0")
    flaky = verdict(100.0, [120.0], 2, 0.05, {}, "oom", "out of memory")
    assert not flaky.passed and flaky.reason == "1 of 2 repeats failed (out of memory)"
    gone = verdict(100.0, [], 1, 0.05, {}, "error", "boom")
    assert gone.measured is None and gone.reason == "the configuration no longer runs: error: boom"
