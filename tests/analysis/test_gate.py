"""``python -m tuner.check``: the regression gate as a ratio measured inside one run, against
its own fresh result (passes), a task made slower (fails) and altered records, at its
default tolerance."""

from __future__ import annotations

import json
import sys

import pytest

import tuner
from tuner.outputs import wording

from conftest import run, toy_recipe

pytestmark = [pytest.mark.slow, pytest.mark.alone]

TASK = {"read_ms": 5.0, "step_ms": 40.0}
"""Each sample reads for 5 ms and each micro-batch computes for 40 ms (sleeps: the same cost
in every process): the baseline reads on the loop (80 + 40 ms a step), the answer reads in 8
workers behind the compute (40 ms, the workers with four times the time they need, so that
they keep up on a busy machine: with 4 and a test running beside it, the answer waited on its
data and compute added to the loss hid behind it): a speedup of about 3x. Steps this long
keep it there beside two busy processes, where the loop's own overhead grew to ~14 ms a step:
with 2.5 ms reads and 20 ms steps the record read 1.9x and a slower task's speedup could not
be told from it. Windows of 20 steps (30 of 20 ms before: whole runs differ by about 3%)."""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A small real search on the toy task: its recipe and run folder."""
    folder = tmp_path_factory.mktemp("check")
    recipe = toy_recipe(folder, task_args=TASK, steps={"warmup": 3, "measure": 20},
                        space={"num_workers": [0, 8]}, budget={"trials": 2})
    result = tuner.search(recipe, out=folder / "run", confirm=3, attribute=0, quiet=True)
    assert result is not None and result.best["params"]["num_workers"] == 8, result.best
    return recipe, folder / "run"


def _altered(run_dir, tmp_path, change):
    best = json.loads((run_dir / "best.json").read_text())
    change(best)
    path = tmp_path / "best.json"
    path.write_text(json.dumps(best))
    return path


def check(*args):
    return run([sys.executable, "-m", "tuner.check", *map(str, args)], timeout=600)


def test_passes_against_its_own_result_at_the_default_tolerance(recorded):
    recipe, run_dir = recorded
    out = tuner.api.check(recipe, run_dir / "best.json", rounds=3).to_json()
    assert out["verdict"] in ("pass", "undecided") and out["tolerance"] == 0.05, out  # never a regression
    assert out["passed"] == (out["verdict"] == "pass")  # undecided is its own verdict (exit 4), not a pass
    assert out["gated"] == "speedup" and out["rounds"] >= 1
    assert len(out["rates"]["answer"]) == len(out["rates"]["baseline"]) == out["rounds"]
    assert out["slowdown"]["high"] > out["slowdown"]["low"]
    assert 2 < out["measured_speedup"] < 4 and 2 < out["recorded_speedup"] < 4, out  # the task's shape


def test_fails_when_the_tasks_code_gets_slower(recorded):
    """120 ms more of compute in the loss (the baseline's step 120 -> 240 ms, the answer's 40 ->
    160): the speedup halves, beyond the 5% tolerance and the interval the record's few runs of
    each end allow. (A 12 ms slowdown read 10.9% smaller, +3.4% to +17.8%: undecided, exit 4;
    48 ms, a third smaller, read +3.1% to +38.7% after 20 rounds with another test file and two
    busy processes beside it, undecided too: a smaller regression is --rev's to gate, on the
    code itself.)"""
    recipe, run_dir = recorded
    proc = check(recipe, "--against", run_dir / "best.json", "--set", "task_args.step_ms=160")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "regression: the speedup is" in proc.stdout, proc.stdout
    assert "smaller (99% interval" in proc.stdout and "not gated" in proc.stdout


def test_an_absolute_rate_is_printed_and_gated_only_when_asked(recorded, tmp_path):
    """A record whose rates were three times higher (another machine, another process): the
    speedup gate does not fail, since the ratio is what one run can compare; --absolute, with
    a between-process noise given, fails it; without one it is refused in one line."""
    recipe, run_dir = recorded

    def inflate(best):
        for part in (best, best["baseline"]):
            part["metrics"]["samples_per_s"] *= 3
        for runs in best["runs"].values():
            for r in runs:
                r["samples_per_s"] *= 3

    path = _altered(run_dir, tmp_path, inflate)
    plain = tuner.api.check(recipe, path, rounds=3)  # its verdict is three rounds': load can flip it
    recorded_speedup = json.loads((run_dir / "best.json").read_text())["speedup"]
    assert plain.gated == "speedup" and plain.to_json()["recorded_speedup"] == pytest.approx(recorded_speedup)
    assert "samples/s is" not in wording.gate(plain)  # the 3x rates are not what it judges
    from tuner.inputs.errors import RecipeError

    with pytest.raises(RecipeError, match="--absolute needs --process-noise"):
        tuner.api.check(recipe, path, rounds=3, absolute=True)
    gated = tuner.api.check(recipe, path, rounds=5, absolute=True, process_noise=0.05)
    assert not gated.passed and gated.verdict == "regression" and gated.gated == "speedup+absolute"
    assert "the answer's samples/s is" in wording.gate(gated)


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
    """Each refusal in one line before anything is measured (the command line's exit 2 and
    its line are the environment test's, above)."""
    from tuner.inputs.errors import RecipeError

    recipe, run_dir = recorded
    with pytest.raises(RecipeError, match="does not exist"):
        tuner.api.check(recipe, tmp_path / "nope")
    with pytest.raises(RecipeError, match="no successful configuration"):
        tuner.api.check(recipe, _altered(run_dir, tmp_path, lambda best: best.update(params=None)))
    with pytest.raises(RecipeError, match=r"--tolerance must be in \[0, 1\)"):
        tuner.api.check(recipe, run_dir, tolerance=1.5)
    with pytest.raises(RecipeError, match="global_batch_size is 32"):
        tuner.api.check(recipe, run_dir, overrides=("global_batch_size=32",))
    same = _altered(run_dir, tmp_path, lambda best: best["baseline"].update(params=best["params"]))
    with pytest.raises(RecipeError, match="nothing to gate.*--absolute"):
        tuner.api.check(recipe, same)
