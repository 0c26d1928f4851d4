"""``launcher: slurm``: each trial an ``srun`` step inside the allocation, two at once on
disjoint node groups with ``parallel: 2``, ended with ``scancel`` (a real single-host Slurm
with two nodes, started by .ci/run)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import uuid

import optuna
import pytest

from conftest import ROOT, TESTS, write_recipe

pytestmark = pytest.mark.slow

FLAGS = {"micro_batch_size": "--batch-size {}", "grad_accum_steps": "--grad-accum-steps {}",
         "num_workers": "--workers {}"}


def _overlapping(trials: list[optuna.trial.FrozenTrial]) -> int:
    """Pairs of trials that ran at the same time."""
    spans = [(t.datetime_start, t.datetime_complete) for t in trials if t.datetime_start and t.datetime_complete]
    return sum(1 for i, a in enumerate(spans) for b in spans[i + 1:] if a[0] < b[1] and b[0] < a[1])


def test_a_script_is_tuned_through_srun_two_trials_at_once(slurm, tmp_path):
    """``salloc -N2 python -m tuner.search``: 4 trials as srun steps, on n1 and on n2 at the
    same time (two workers of one study, one per node); the search process writes the run
    folder; no step is left."""
    name = f"slurm-{uuid.uuid4().hex[:6]}"
    recipe = write_recipe(tmp_path, {
        "name": name, "script": str(TESTS / "helpers" / "flags_train.py"), "adapt": "torch",
        "args": ["--latency-ms", "2"], "global_batch_size": 16, "knobs": FLAGS, "launcher": "slurm", "parallel": 2,
        "steps": {"warmup": 2, "measure": 6}, "timeout_s": 120, "out": str(tmp_path / "run"),
        "space": {"micro_batch_size": [16, 8, 4], "num_workers": [0, 1]}, "budget": {"trials": 4}})
    done = subprocess.run(["salloc", "-N2", "--quiet", sys.executable, "-m", "tuner.search", str(recipe),
                           "--confirm", "1", "--attribute", "0", "--quiet"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=slurm)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    with open(tmp_path / "run" / "trials.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["micro_batch_size"]]
    assert len(rows) == 4 and all(r["state"] in ("ok", "pruned") for r in rows), [r["reason"] for r in rows]
    assert len({r["worker"] for r in rows}) == 2
    commands = [p.read_text().splitlines()[0] for p in (tmp_path / "run" / "trials").glob("*/output.log")]
    assert all(c.startswith("tuner: srun --nodes=1") for c in commands), commands[:2]
    assert any("--nodelist=n1 " in c for c in commands) and any("--nodelist=n2 " in c for c in commands), commands
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'run' / 'study.db'}")
    assert _overlapping([t for t in study.trials if "params" in t.user_attrs]) >= 1
    assert (tmp_path / "run" / "best.json").exists() and (tmp_path / "run" / "worker-1.log").exists()
    left = subprocess.run(["squeue", "-h", "-s", "-o", "%j"], capture_output=True, text=True, env=slurm).stdout
    assert "tuner-" not in left, left


def test_a_trial_that_never_reports_is_ended_with_scancel(slurm, tmp_path):
    """A script that never reports: at its 8 s limit the step is cancelled by the scheduler
    (no tuner step left in squeue, its process gone) and the trial is recorded with why."""
    script = tmp_path / "silent.py"
    marker = f"silent-{uuid.uuid4().hex[:8]}"
    script.write_text(f"import time\n# {marker}\nwhile True:\n    time.sleep(1)\n")
    recipe = write_recipe(tmp_path, {
        "name": "silent", "script": str(script), "global_batch_size": 4, "launcher": "slurm", "timeout_s": 8,
        "steps": {"warmup": 1, "measure": 4}, "out": str(tmp_path / "run"), "budget": {"trials": 1}})
    done = subprocess.run(["salloc", "-N1", "--quiet", sys.executable, "-m", "tuner.search", str(recipe),
                           "--confirm", "0", "--attribute", "0", "--quiet"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=slurm)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "run" / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["state"] == "error" and "no report after 8 s" in rows[0]["reason"], rows
    log = (tmp_path / "run" / "trials" / "001" / "output.log").read_text()
    assert "tuner: scancel " in log and "(the step had ended)" not in log, log[-500:]
    left = subprocess.run(["squeue", "-h", "-s", "-o", "%j"], capture_output=True, text=True, env=slurm).stdout
    assert "tuner-" not in left, left
    assert subprocess.run(["pgrep", "-f", str(script)], capture_output=True).returncode == 1  # nothing of it runs


def test_slurm_recipes_that_cannot_run_say_so_in_one_line(slurm, tmp_path, monkeypatch):
    """Outside an allocation, an allocation without nodes, more node groups than it has,
    parallel without slurm, an unknown launcher: one line that says what to do, before any
    trial (``ScriptTrials`` checks the allocation when the search starts)."""
    from tuner.inputs.errors import RecipeError
    from tuner.inputs.recipe import load_recipe
    from tuner.scriptmode.launcher import ScriptTrials

    base = {"name": "s", "script": str(TESTS / "helpers" / "flags_train.py"), "adapt": "torch", "knobs": FLAGS,
            "global_batch_size": 16, "space": {"micro_batch_size": [16, 8], "num_workers": [0, 1]},
            "out": str(tmp_path / "run")}
    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    cases = [({"launcher": "slurm"}, {}, "inside an allocation"),
             ({"launcher": "slurm"}, {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": ""}, "names no nodes"),
             ({"launcher": "slurm", "parallel": 3}, {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"}, "need 3 nodes"),
             ({"parallel": 2}, {}, "needs launcher: slurm"),
             ({"launcher": "pbs"}, {}, "launcher: expected python"),
             ({"launcher": "python", "nproc_per_node": 2}, {}, "need launcher: torchrun")]
    for fields, extra, said in cases:
        for key, value in extra.items():
            monkeypatch.setenv(key, value)
        with pytest.raises(RecipeError) as caught:
            recipe = load_recipe(write_recipe(tmp_path, {**base, **fields}))
            ScriptTrials(recipe, tmp_path / "run")
        assert said in str(caught.value) and "\n" not in str(caught.value), (fields, str(caught.value))
        for key in extra:
            monkeypatch.delenv(key)
