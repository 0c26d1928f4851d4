"""``tuner compare RUN_A RUN_B``: one configuration of each run, every metric's ratio, its
interval against the tolerance (each run's noise counted once), and refused across machines."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import tuner
from tuner.inputs.errors import RecipeError

from conftest import ROOT, write_recipe


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One search where loader workers pay for 3 ms reads: the baseline (no workers) and the
    best, re-measured by the finish at its defaults (two paired rounds at least), so both have
    repeats. With ``confirm=2`` a loaded machine's noise (dof 5) left a 2.6x gain undecided."""
    tmp = tmp_path_factory.mktemp("compare")
    recipe = write_recipe(tmp, {
        "name": "cmp", "task": str(ROOT / "recipes" / "tasks" / "slow_reads.py"),
        "task_args": {"read_latency_ms": 3.0, "size": 4096}, "global_batch_size": 32,
        "steps": {"warmup": 2, "measure": 10}, "out": str(tmp / "run"), "baseline": {"num_workers": 0},
        "space": {"num_workers": [0, 2]}})
    result = tuner.search(recipe, trials=2, attribute=0, quiet=True)  # the finish at its defaults
    assert result.best["params"]["num_workers"] == 2, result.best
    return tmp / "run"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tuner.compare", *map(str, args)], capture_output=True, text=True)


@pytest.mark.slow
def test_the_best_against_the_baseline_is_beyond_the_tolerance(run, tmp_path):
    c = tuner.compare(run, run, a="baseline", b="best")
    rate = next(r for r in c.rows if r.metric == "samples_per_s")
    # beyond where the interval shows it; beside two busy processes (CI, 2026-12-05) a 1.75x
    # read (-21%, +352%) on 6 degrees of freedom, and "undecided" was the true verdict
    assert rate.ratio > 1.3 and c.tolerance == 0.02 and rate.interval[1] > c.tolerance, rate
    assert rate.verdict == ("beyond" if rate.interval[0] > c.tolerance else "undecided"), rate
    assert ("num_workers", 0, 2) in c.params
    record = json.loads((run / "best.json").read_text())
    assert len(record["runs"]["best"]) >= 2 and len(record["runs"]["baseline"]) >= 2  # what the verdict stands on
    assert record["noise"]["dof"] >= 2
    proc = _cli(run, run, "--a", "baseline", "--html", tmp_path / "c.html")
    assert proc.returncode == 0, proc.stderr
    said = "beyond the 2% tolerance" if rate.verdict == "beyond" else "undecided"
    assert "knobs that differ: num_workers 0 -> 2" in proc.stdout and said in proc.stdout, proc.stdout
    page = (tmp_path / "c.html").read_text()
    assert f"<tr class='{rate.verdict}'><td>samples_per_s</td>" in page


@pytest.mark.slow
def test_one_trial_against_another_without_repeats_is_unknown_not_the_same(run, tmp_path):
    lone = tmp_path / "lone"
    shutil.copytree(run, lone)
    record = json.loads((lone / "best.json").read_text())
    record["noise"] = {"ss": 0.0, "dof": 0}  # a run that never measured anything twice
    (lone / "best.json").write_text(json.dumps(record))
    c = tuner.compare(lone, lone, a=0, b=1)
    rate = next(r for r in c.rows if r.metric == "samples_per_s")
    assert rate.verdict is None and rate.ratio is not None
    assert "unknown (no repeats)" in _cli(lone, lone, "--a", "0", "--b", "1").stdout


@pytest.mark.slow
def test_one_run_folder_counts_its_noise_once_and_two_are_two_processes(run, tmp_path):
    """Two single trials of one run lean on the run's pooled noise: once, not once per side.
    A copy of the folder is another run, another process: its rates are not judged on one
    process's noise (the same baseline read 2.39x, "beyond the tolerance", between two search
    processes), only with a between-process noise given, which widens the interval."""
    record = json.loads((run / "best.json").read_text())
    same = next(r for r in tuner.compare(run, run, a=0, b=1).rows if r.metric == "samples_per_s")
    assert same.dof == record["noise"]["dof"], (same, record["noise"])
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    other = next(r for r in tuner.compare(run, copy, a=0, b=1).rows if r.metric == "samples_per_s")
    assert other.verdict == "processes" and other.interval is None
    assert "not judged: two processes' rates" in _cli(run, copy, "--a", "0", "--b", "1").stdout
    given = next(r for r in tuner.compare(run, copy, a=0, b=1, process_noise=0.05).rows
                 if r.metric == "samples_per_s")
    assert given.dof == 2 * record["noise"]["dof"] and given.verdict in ("beyond", "within", "undecided")
    # more between-process noise, a wider interval (against the same run's interval it need not
    # be: two folders' noises add their degrees of freedom, and at 1 dof t is 63.7, at 2 only 9.9)
    quieter = next(r for r in tuner.compare(run, copy, a=0, b=1, process_noise=0.001).rows
                   if r.metric == "samples_per_s")
    assert given.interval[1] - given.interval[0] > quieter.interval[1] - quieter.interval[0]


def test_the_tolerance_decides_within_beyond_and_undecided():
    from tuner.analysis.run_verdicts import against

    assert against((0.03, 0.08), 0.02) == "beyond" and against((-0.09, -0.03), 0.02) == "beyond"
    assert against((-0.01, 0.015), 0.02) == "within"
    assert against((0.0, 0.04), 0.02) == "undecided" and against((0.0, 0.04), 0.05) == "within"


@pytest.mark.slow
def test_runs_from_other_machines_are_refused_in_one_line_or_shown_anyway(run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(run, other)
    record = json.loads((other / "best.json").read_text())
    record["environment"].update(torch="2.99.0", device="NVIDIA H200")
    (other / "best.json").write_text(json.dumps(record))
    proc = _cli(run, other)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: the runs were measured on different machines (device:") and "torch:" in line
    shown = _cli(run, other, "--anyway", "--json")
    assert shown.returncode == 0 and [d["key"] for d in json.loads(shown.stdout)["refused"]] == ["device", "torch"]
    text = _cli(run, other, "--anyway").stdout
    assert "not comparable: device: A " in text and ", B 'NVIDIA H200'" in text, text
    assert "not comparable: torch: A " in text and ", B '2.99.0'" in text, text


@pytest.mark.parametrize(("which", "message"), [("999", "no trial 999"), ("fastest", "expected best, baseline or")])
@pytest.mark.slow
def test_bad_input_is_one_line(run, tmp_path, which, message):
    with pytest.raises(RecipeError, match=message):
        tuner.compare(run, run, a=which)
    proc = _cli(tmp_path / "nope", run)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("is not a folder; give a search's run folder "
                                                                 "(runs/NAME)"), proc.stderr


def test_no_interval_of_a_ratio_runs_below_minus_100_percent_and_the_window_is_not_judged():
    """BERT's baseline (step times 0.4-1.6 s, five runs) against a trial at 0.077 s read
    "0.126, undecided (-710.1% to +468.2%)": a difference of means, a ratio below -100%. A
    metric positive in every run is read on a log scale; one that can be 0 keeps its
    difference of means, its low end at -100%; the window's own length is not judged."""
    from tuner.analysis.run_verdicts import Side, compare

    slow = [{"step_time_p50_s": t, "data_wait_share": w, "measured_steps": 22}
            for t, w in ((0.40, 0.0), (0.61, 0.01), (1.60, 0.0), (0.45, 0.002), (0.90, 0.0))]
    fast = [{"step_time_p50_s": t, "data_wait_share": w, "measured_steps": 14}
            for t, w in ((0.077, 0.004), (0.080, 0.0))]
    a = Side("run", "baseline", {}, {"step_time_p50_s": 0.61, "data_wait_share": 0.002, "measured_steps": 22}, slow)
    b = Side("run", "trial 2", {}, {"step_time_p50_s": 0.078, "data_wait_share": 0.002, "measured_steps": 14}, fast)
    rows = {r.metric: r for r in compare(a, b, tolerance=0.02).rows}
    step = rows["step_time_p50_s"]
    assert step.interval is not None and -1.0 < step.interval[0] < step.ratio - 1 < step.interval[1], step
    assert step.verdict == "beyond" or step.interval[1] >= -0.02  # read the way the interval reads
    wait = rows["data_wait_share"]
    assert wait.interval is not None and wait.interval[0] >= -1.0, wait
    assert rows["measured_steps"].verdict == "window" and rows["measured_steps"].interval is None
