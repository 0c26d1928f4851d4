"""One result type: best.json is SearchResult.to_json, and it reads back whole."""

from __future__ import annotations

from pathlib import Path

from tuner.analysis.attribution import attribute, key
from tuner.analysis.diagnose import diagnose
from tuner.tuning.search_result import SearchResult


def _result() -> SearchResult:
    base, best = {"num_workers": 0, "amp_dtype": "fp32"}, {"num_workers": 4, "amp_dtype": "bf16"}
    rates = {key(base): [100.0, 110.0], key({**base, "num_workers": 4}): [300.0, 320.0], key(best): [400.0, 390.0],
             key({**best, "num_workers": 0}): [120.0, 118.0]}
    attribution = attribute(base, best, rates, {})
    metrics = {"samples_per_s": 400.0, "data_wait_share": 0.5, "stall_free_samples_per_s": 2000.0}
    return SearchResult(
        out=Path("runs/x"), best={"params": best, "metrics": metrics, "source": "median of 3 confirmation runs",
                                  "failures": 1, "trial": 4, "command": "python -m tuner.measure x.yaml"},
        baseline={"params": base, "metrics": {"samples_per_s": 100.0}, "failures": 0, "trial": 0},
        speedup=4.0, target_met=False, stopped="trials", trials=7, environment={"cuda": None},
        diagnosis={"best": diagnose(metrics), "baseline": []}, attribution=attribution, name="x",
        recipe="x.yaml", memory_budget_gib=8.0, world_size=2,
    )


def test_best_json_reads_back_into_the_same_result():
    result = _result()
    record = result.to_json()
    again = SearchResult.from_json(record, result.out)
    assert again.to_json() == record
    assert again.diagnosis["best"][0].kind == "data-bound" and again.attribution == result.attribution
    assert again.best["failures"] == 1 and again.best["command"] == result.best["command"]


def test_best_json_keeps_design_mds_keys():
    record = _result().to_json()
    assert set(record) >= {"params", "metrics", "baseline", "speedup", "target_met", "environment"}
    assert record["baseline"] == {"params": {"num_workers": 0, "amp_dtype": "fp32"},
                                  "metrics": {"samples_per_s": 100.0}}


def test_the_run_it_again_command_sets_what_the_baseline_does_not_already_run(toy):
    """The command sets the answer's knobs away from their defaults, and a default the
    baseline did not run; ``tuner.measure`` then runs the answer, knob for knob (it set all 30
    knobs, 1,200 characters, for an answer that changed one)."""
    import json
    import shlex
    import subprocess
    import sys

    from tuner.inputs.levers import LEVERS
    from tuner.tuning.search_result import measure_command

    recipe = toy(space={"num_workers": [0, 2], "persistent_workers": [False, True]},
                 baseline={"persistent_workers": True, "num_workers": 2})
    defaults = {**{name: lever.default for name, lever in LEVERS.items()}, "micro_batch_size": 16}
    baseline = {**defaults, "persistent_workers": True, "num_workers": 2}
    answer = {**defaults, "num_workers": 2, "persistent_workers": False}
    command = measure_command(recipe, 1, answer, baseline=baseline)
    words = shlex.split(command)
    assert [w for w in words if "=" in w] == ["num_workers=2", "persistent_workers=false", "micro_batch_size=16"]
    assert measure_command(recipe, 1, defaults, baseline=defaults).endswith(f"{recipe} --set micro_batch_size=16")
    proc = subprocess.run([sys.executable, *words[1:], "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ran = json.loads(proc.stdout)["params"]
    assert {k: ran[k] for k in answer} == answer
