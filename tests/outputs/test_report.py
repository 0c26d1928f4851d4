"""report.md and report.html: written by a search, rebuilt from the study alone, and
rendered by a real headless Chromium (installed by .ci/run from Debian's packages)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import tuner

from conftest import run, toy_recipe


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A real search on the toy task: a slow loader, workers to find, and micro-batch 16
    running out of memory (so the report has failures to show). The reads are host waits of
    2 ms a sample, 16 ms a batch, several times the model's step even beside two busy
    processes: at 0.5 ms a sample, there, workers bought less than 1.10x and the baseline
    read host-CPU-saturated rather than data-bound."""
    folder = tmp_path_factory.mktemp("report")
    recipe = toy_recipe(folder, task_args={"read_ms": 2.0, "oom_at_micro": 16, "oom_rank": 0},
                        steps={"warmup": 2, "measure": 15}, budget={"trials": 6, "memory_gib": 8},
                        space={"num_workers": [0, 1, 2, 4], "micro_batch_size": [8, 16]},
                        baseline={"num_workers": 0, "micro_batch_size": 8}, price={"gpu_hour": 2.4})
    result = tuner.search(recipe, out=folder / "run", confirm=1, quiet=True)
    assert result is not None
    return folder / "run"


@pytest.mark.slow
def test_no_sentence_of_the_search_contradicts_its_own_numbers(searched):
    """The console's lines and report.md, checked against best.json and trials.csv
    (tests/sentences.py): the summary's rates and speedup, each verdict's figures against its
    configuration's metrics, each change's label, no unmeasured zero, no advice to try what
    was measured."""
    from sentences import contradictions

    found, checked = contradictions(searched)
    assert found == [], found
    assert {"summary", "advice"} <= checked and any(k.startswith("verdict ") for k in checked), checked


@pytest.mark.slow
def test_search_writes_a_report_a_user_can_read(searched):
    md = (searched / "report.md").read_text()
    for section in ("# tuner report: toy", "## Best vs baseline", "## Configuration to paste", "## Trials",
                    "## Environment", "step p99 (ms)", "failed runs"):
        assert section in md, section
    assert re.search(r"\*\*\d+\.\d\dx\*\* the baseline's throughput", md)
    # the slow loader with no workers: data-bound, or, where other work takes the cores, the
    # saturated host the trials' evidence shows instead, or (a fresh-clone CI beside other
    # tests) a step so slowed that the wait fell under the bar: compute-bound
    verdicts = json.loads((searched / "best.json").read_text())["diagnosis"]["baseline"]
    assert verdicts and verdicts[0]["kind"] in ("data-bound", "host-cpu-saturated", "compute-bound"), verdicts
    assert f"**baseline: {verdicts[0]['kind']}**: {verdicts[0]['evidence']}" in md
    searched_best = json.loads((searched / "best.json").read_text())
    if searched_best["metrics"]["energy_j_per_sample"] is None:  # this CPU
        assert "| energy (J/sample) | not measured | not measured |" in md  # never a bare dash or a 0
        why = searched_best["unmeasured"]["energy_j_per_sample"]  # and why, as the trials recorded it
        assert f"- energy (J/sample), not measured: {why}" in md
    assert "| oom |" in md  # the failing micro-batch is listed with its state
    best = json.loads((searched / "best.json").read_text())
    cost = best["price"]["best"]["samples"]  # 2.40 an hour, one device: 1e6 samples at the best's rate
    assert cost == pytest.approx(2.4 / 3600 / best["metrics"]["samples_per_s"] * 1e6)
    assert "| cost of a million samples (at 2.4 a device-hour, 1 device(s)) | " in md
    page = (searched / "report.html").read_text()
    assert page.count("<svg") >= 4  # history, memory, prediction, breakdown (+ importance with enough trials)
    assert "Peak memory: predicted before each trial vs measured" in page
    assert not re.search(r"""(src|href)=["']https?:""", page)  # self-contained: nothing fetched


@pytest.mark.slow
def test_report_command_rebuilds_both_from_the_study_alone(searched, tmp_path):
    copy = tmp_path / "run"
    copy.mkdir()
    shutil.copy(searched / "study.db", copy / "study.db")  # the study, nothing else
    proc = run([sys.executable, "-m", "tuner.report", str(copy)])
    assert proc.returncode == 0, proc.stderr
    assert (copy / "report.md").read_text() == (searched / "report.md").read_text()
    assert (copy / "report.html").is_file()
    # the Python API takes the search's study, or Optuna's own (``result.study.optuna``)
    import optuna

    from tuner.outputs.report.build import build_report

    again = tmp_path / "again"
    again.mkdir()
    raw = optuna.load_study(study_name="toy", storage=f"sqlite:///{copy / 'study.db'}")
    md, _ = build_report(again, raw)
    assert md.read_text() == (searched / "report.md").read_text()


def test_report_command_refuses_what_is_not_a_run(tmp_path):
    missing = run([sys.executable, "-m", "tuner.report", str(tmp_path / "nope")])
    assert missing.returncode == 2 and "is not a folder" in missing.stderr
    empty = run([sys.executable, "-m", "tuner.report", str(tmp_path)])
    assert empty.returncode == 2 and "no study.db here" in empty.stderr
    assert "Traceback" not in missing.stderr + empty.stderr


def _chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.environ.get("TUNER_REQUIRE_CHROMIUM"):
        pytest.fail("chromium is required here (TUNER_REQUIRE_CHROMIUM) but not installed")
    return found


@pytest.mark.slow
def test_html_report_renders_its_plots_in_headless_chromium(searched, tmp_path):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no chromium here (.ci/run installs Debian's)")
    from PIL import Image

    page = (searched / "report.html").resolve()
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == (searched / "report.html").read_text().count("<svg")
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr
    shot = tmp_path / "report.png"
    proc = subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 2400)
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 200  # text, tables and plots drawn, not a blank page
    # the plots' markers (matplotlib's default blue, #1f77b4) are on the page
    assert any(abs(r - 0x1F) < 12 and abs(g - 0x77) < 12 and abs(b - 0xB4) < 12 for _, (r, g, b) in colours)


def _study(n: int, top: str):
    """A finished study of ``n`` feasible trials where ``top`` alone decides samples/s."""
    import optuna

    from tuner.trial.trial_result import State

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(n):
        trial = study.ask()
        params = {"num_workers": trial.suggest_categorical("num_workers", [0, 1, 2, 4]),
                  "micro_batch_size": trial.suggest_categorical("micro_batch_size", [8, 16, 32])}
        for key, value in {"state": State.OK.value, "params": params,
                           "metrics": {"samples_per_s": 100.0 + 50 * params[top]}}.items():
            trial.set_user_attr(key, value)
        study.tell(trial, 100.0 + 50 * params[top])
    from tuner.study.study import Study

    return Study(study)


def _with_attribution(top: str):
    from tuner.analysis.attribution import Attribution, Row
    from tuner.tuning.search_result import SearchResult

    row = Row(top, 0, 4, 300.0, 3.0, 1.0, 100.0, 1.0, "")
    return SearchResult(out=None, best={}, baseline={}, speedup=None, target_met=False, stopped="trials", trials=0,
                        attribution=Attribution(100.0, 300.0, [row]))


def test_importance_shows_only_on_enough_trials_and_never_against_the_attribution():
    from tuner.outputs.report.build import _importance, collect

    few = _study(7, "num_workers")
    importance, note = _importance(few, collect(few, None).trials, _with_attribution("num_workers"))
    assert importance == {} and "7 feasible trial(s); it needs 10" in note
    many = _study(24, "num_workers")
    trials = collect(many, None).trials
    importance, note = _importance(many, trials, _with_attribution("num_workers"))
    assert list(importance)[0] == "num_workers" and note == "Rests on 24 feasible trials (Optuna, PED-ANOVA)."
    # the attribution measured micro_batch_size as the gain; an importance ranking it last is not shown
    importance, note = _importance(many, trials, _with_attribution("micro_batch_size"))
    assert importance == {} and "ranks micro_batch_size 2 of 2" in note and "100% of the gain" in note


def test_a_metric_not_measured_says_why_as_the_trials_recorded_it():
    """pytorch/examples' word_language_model under adapt: torch: its report read "data wait,
    not measured: nothing in this run measures it here" beside the adapter's note that said
    why. The reason is a record by metric name (``unmeasured``), read back from best.json."""
    from tuner.outputs.report.markdown import _comparison_table
    from tuner.tuning.search_result import SearchResult

    metrics = {"samples_per_s": 113.1, "data_wait_share": None, "comm_share": 0.0}
    why = "the script iterated no torch DataLoader before its first optimizer step"
    side = {"params": {}, "metrics": metrics}
    written = SearchResult(out=None, best=side, baseline=dict(side), speedup=1.0, target_met=False, stopped="trials",
                           trials=3, unmeasured={"data_wait_share": why})
    result = SearchResult.from_json(written.to_json(), None)
    lines = _comparison_table(result)
    assert f"- data wait, not measured: {why}" in lines, lines
    assert not any("comm, not measured" in line for line in lines)  # measured: 0% is a measurement
    assert "- peak memory (GiB), not measured: nothing in this run measures it here" in lines  # said by no note
