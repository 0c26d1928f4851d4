"""The search end to end: real trials, a real SQLite study, the outputs a user pastes."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import statistics
import sys
import time

import optuna
import pytest

import tuner
from tuner.trial.run import run_trial

from conftest import run, torchrun

LATENCY = {"read_ms": 1.0}


def rows(out) -> list[dict[str, str]]:
    with open(out / "trials.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # 15 s on a quiet machine: a search with its finish and attribution
@pytest.mark.alone  # its 1.25x and its sentences: a two-at-a-time CI run read 64% noise a run and answered 1.0x
def test_search_finds_loader_workers_and_writes_every_output(toy, tmp_path):
    recipe = toy(task_args=LATENCY, steps={"warmup": 2, "measure": 6},
                 space={"num_workers": [0, 1, 2, 4, 8], "micro_batch_size": [8, 16]},
                 baseline={"num_workers": 0})
    out = tmp_path / "run"
    result = tuner.search(recipe, trials=6, out=out, confirm=2, attribute=1, quiet=True)
    assert result.stopped == "trials" and result.trials == 6
    assert result.baseline["params"]["num_workers"] == 0
    assert result.speedup >= 1.25, result.speedup
    # one number per configuration: every run of it pooled, its search trial, its repeat and
    # the finish's runs ("median of 4 runs (1 search trial, 3 finish runs)")
    assert 2 <= sum(result.best["source"].values()) <= 9, result.best
    assert set(result.best["source"]) <= {"search", "repeat", "finish", "attribution"}, result.best
    for name in ("best.json", "dataloader.json", "ds_config.json", "accelerate_config.yaml",
                 "hf_training_args.json", "torchtitan.toml", "torch_settings.py", "lightning_trainer.yaml",
                 "trials.csv", "search.log", "study.db", "report.md", "report.html"):
        assert (out / name).exists(), name
    best = json.loads((out / "best.json").read_text())
    assert set(best) >= {"params", "metrics", "baseline", "speedup", "target_met", "environment"}
    from sentences import contradictions

    found, checked = contradictions(out)  # every sentence against the run's own numbers
    assert found == [] and "summary" in checked, (found, checked)
    ratio = best["metrics"]["samples_per_s"] / best["baseline"]["metrics"]["samples_per_s"]
    assert ratio == pytest.approx(best["speedup"])
    paired = best["speedup_paired"]  # the finish's rounds of the answer and the baseline, paired
    assert paired["pairs"] >= 2 and paired["low"] <= paired["speedup"] <= paired["high"], paired
    assert "paired speedup" in checked  # said on the console's summary line and in report.md
    assert "tuner.measure" in best["command"] and "--set num_workers=" in best["command"]
    loader = json.loads((out / "dataloader.json").read_text())
    assert loader["num_workers"] == best["params"]["num_workers"]
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["train_batch_size"] == 16 == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"]
    from deepspeed.runtime.config import DeepSpeedConfig

    DeepSpeedConfig(ds)  # accepted by DeepSpeed as written (it checks the batch arithmetic)
    table = rows(out)
    assert len(table) == 6 and table[0]["baseline"] == "True"
    assert all(r["state"] in ("ok", "pruned") for r in table)


@pytest.mark.slow
def test_rerunning_resumes_and_the_budget_counts_what_was_done(toy, tmp_path):
    recipe = toy(task_args=LATENCY, space={"num_workers": [0, 1, 2, 3], "micro_batch_size": [4, 8, 16]})
    out = tmp_path / "run"
    tuner.search(recipe, trials=3, out=out, confirm=0, quiet=True)
    again = tuner.search(recipe, trials=5, out=out, confirm=0, quiet=True)
    assert again.trials == 5
    numbers = [int(r["number"]) for r in rows(out)]
    assert numbers[:3] == [0, 1, 2]  # the first run's trials are still there
    done = tuner.search(recipe, trials=5, out=out, confirm=0, quiet=True)
    assert done.stopped == "trials" and done.trials == 5  # nothing left to run


@pytest.mark.slow  # 11 s beside another test of the quick tier
def test_a_space_measured_through_stops_at_once_and_trials_csv_has_one_row_each(toy, tmp_path):
    """Four configurations and a budget of 30: the search stops as exhausted after the
    fourth, and the sampler's repeated proposals are no rows (a 12-point job once wrote 111)."""
    recipe = toy(task_args=LATENCY, space={"num_workers": [0, 1], "micro_batch_size": [8, 16]})
    out = tmp_path / "run"
    result = tuner.search(recipe, trials=30, out=out, confirm=0, quiet=True, full_budget=True)
    assert result.stopped == "exhausted" and result.trials == 4
    table = rows(out)
    keys = [(r["num_workers"], r["micro_batch_size"]) for r in table]
    assert len(table) == 4 and len(set(keys)) == 4
    assert "duplicate_of" not in table[0]


@pytest.mark.slow
def test_target_and_time_budget_stop_early(toy, tmp_path):
    recipe = toy(target={"samples_per_s": 1.0}, space={"num_workers": [0, 1, 2]})
    result = tuner.search(recipe, trials=10, out=tmp_path / "t", confirm=0, quiet=True)
    assert result.stopped == "target" and result.trials == 1 and result.target_met
    slow = toy(task_args={"read_ms": 2.0}, steps={"warmup": 2, "measure": 10},
               space={"num_workers": [0, 1, 2, 3], "micro_batch_size": [2, 4, 8, 16]})
    start = time.monotonic()
    result = tuner.search(slow, trials=30, minutes=0.05, out=tmp_path / "m", confirm=0, quiet=True)
    assert result.stopped == "minutes" and result.trials < 30
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_the_minutes_bound_the_search_and_its_finish_together(toy, tmp_path):
    """``budget.minutes`` is the whole command's: the trials stop leaving room for the finish,
    which plans its runs inside what is left (imagenet/main.py once ran 5.8 min of finish
    after 3.6 min of trials under ``budget.minutes: 4``). At the defaults (finish and
    attribution on): done within the minutes plus one trial."""
    recipe = toy(task_args={"read_ms": 2.0}, steps={"warmup": 2, "measure": 10}, budget={"minutes": 0.25},
                 space={"num_workers": [0, 1, 2, 3], "micro_batch_size": [2, 4, 8, 16]})
    start = time.monotonic()
    result = tuner.search(recipe, out=tmp_path / "m", quiet=True)
    wall = time.monotonic() - start
    with open(tmp_path / "m" / "trials.csv", newline="") as f:
        longest = max(float(r["duration_s"]) for r in csv.DictReader(f) if r["duration_s"])
    assert result.stopped == "minutes" and wall <= 15 + longest + 5, (wall, longest, result.stopped)


def test_infeasible_over_memory_budget_is_complete_not_failed(toy, tmp_path):
    recipe = toy(budget={"memory_gib": 0.01}, space={"num_workers": [0, 1]})
    result = tuner.search(recipe, trials=2, out=tmp_path / "r", confirm=0, quiet=True)
    assert result.best["params"] is None  # nothing fits in 10 MiB
    study = optuna.load_study(study_name="toy", storage=f"sqlite:///{tmp_path / 'r' / 'study.db'}")
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert t.user_attrs["state"] == "over_budget" and "over budget.memory_gib" in t.user_attrs["reason"]
        assert t.user_attrs["constraint"] > 0


def test_prune_rule_cuts_a_trial_short(toy):
    recipe = tuner.load_recipe(toy(steps={"warmup": 1, "measure": 12}))
    from tuner.harness import distributed
    from tuner.inputs.space import Machine, make_config

    config, _ = make_config({}, 16, 1, Machine.detect())
    seen = []

    def rule(window) -> bool:
        seen.append(len(window.step_times))
        return len(window.step_times) >= 4

    result = run_trial(recipe, config, distributed.context(), prune=rule)
    assert result.state == "pruned" and seen == [2, 3, 4]  # asked early, then less often
    steps, rate = result.pruned_at
    assert steps == 4 and rate > 0  # what the sampler is told, after the trial
    assert len(result.losses) >= 1 + steps  # its curve so far (warm-up included), for the precision guard


def test_a_pruned_trial_reaches_optuna_after_its_window_with_its_rate(toy, tmp_path):
    """The measured loop writes nothing to storage: the rate at the cut is reported to the
    study when the trial is recorded, and the sampler sees a PRUNED trial with it."""
    import optuna

    from tuner.harness import distributed
    from tuner.inputs.space import Machine, make_config
    from tuner.stats.prune import PruneBar
    from tuner.study import records as study_mod

    recipe = tuner.load_recipe(toy(steps={"warmup": 1, "measure": 30}, storage=f"sqlite:///{tmp_path}/s.db"))
    config, _ = make_config({}, 16, 1, Machine.detect())
    rule = PruneBar(1e12, 1, noise=0.05, noise_dof=4, settle_within=30)
    result = run_trial(recipe, config, distributed.context(), prune=rule)
    study, _ = study_mod.open_study(recipe.name, recipe.storage, 0)
    trial = study.ask()
    state, frozen = study_mod.record(study, trial, result, recipe.budget)
    assert state == "pruned" and frozen.status == "pruned"
    steps, rate = result.pruned_at
    assert study.optuna.trials[frozen.number].state == optuna.trial.TrialState.PRUNED
    assert study.optuna.trials[frozen.number].intermediate_values == {steps: pytest.approx(rate)}
    assert steps >= 30 // 2 + 3  # past half the window: a first-use plateau shorter would have ended
    assert frozen.outcome == "pruned"


@pytest.mark.slow
def test_search_command_under_two_ranks_with_zero_stages_and_an_oom_rank(toy, tmp_path):
    """Rank 1 runs out of memory for micro-batches of 8: those trials are infeasible, the
    other rank does not hang. A sharded trial that failed on one rank can leave the other's
    collectives queued, so the search records it and its ranks exit 75 with one line (torchrun
    itself exits 1); the same command resumes and finishes with ZeRO stages compared. (ZeRO-3
    is left out: its forward runs collectives before the task's loss can fail, so a rank
    failing there is a hang the watchdog ends, tests/tuning/test_hangs.py.)"""
    recipe = toy(task_args={"oom_at_micro": 8, "read_ms": 0.2}, steps={"warmup": 1, "measure": 4},
                 space={"micro_batch_size": [2, 4, 8], "zero_stage": [0, 2]})
    out = tmp_path / "run"
    command = ["-m", "tuner.search", str(recipe), "--trials", "6", "--out", str(out), "--confirm", "0"]
    restarts = 0
    for _ in range(3):  # at most the one sharded micro-batch-8 configuration, then done
        proc = torchrun(2, *command, timeout=300)
        if proc.returncode == 0:
            break
        assert "exitcode  : 75" in proc.stderr, proc.stderr[-3000:]
        restarts += 1
        said = [line for line in proc.stderr.splitlines() if "re-run the same command to resume" in line]
        assert len(said) == 1 and "collectives queued" in said[0] and "recorded as oom" in said[0], proc.stderr
        # torchrun prints its own traceback for a child's non-zero exit; none comes from the tuner
        assert not [line for line in proc.stderr.splitlines() if 'File "' in line and "/tuner/" in line], proc.stderr
    assert proc.returncode == 0, proc.stderr[-4000:]
    table = [r for r in rows(out)]
    assert len(table) == 6
    for r in table:
        if r["micro_batch_size"] == "8":
            assert r["state"] == "oom" and "rank 1" in r["reason"], r
        else:
            assert r["state"] in ("ok", "pruned"), r
    sharded_ooms = sum(r["micro_batch_size"] == "8" and r["zero_stage"] != "0" for r in table)
    assert restarts == sharded_ooms  # each one ended its process, and only those
    assert {r["engine"] for r in table if r["zero_stage"] != "0"} <= {"deepspeed"}
    best = json.loads((out / "best.json").read_text())
    assert best["environment"]["world_size"] == 2 and best["params"]["micro_batch_size"] in (2, 4)
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == best["params"]["zero_stage"]
    assert ds["train_batch_size"] == 16
    assert "tuner.search toy" not in proc.stdout  # the live table goes to stderr...
    assert proc.stderr.count("tuner.search toy") == 1  # ...from rank 0 only


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -9), (signal.SIGINT, 130)])
def test_killed_search_keeps_its_trials_and_resumes(toy, tmp_path, sig, code):
    recipe = toy(task_args={"read_ms": 2.0}, steps={"warmup": 1, "measure": 15},
                 space={"num_workers": [0, 1, 2, 3], "micro_batch_size": [2, 4, 8, 16]})
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "tuner.search", str(recipe), "--trials", "5", "--out", str(out), "--confirm", "0"]
    import subprocess

    proc = subprocess.Popen(cmd, cwd=os.getcwd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    storage = f"sqlite:///{out / 'study.db'}"
    deadline = time.monotonic() + 120
    finished = re.compile(r"^\S+ \S+ +\d+  workers=\d+ ")  # a trial's row in search.log
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
        # The log, not the study: opening a new SQLite study while the search creates it races.
        log = out / "search.log"
        if log.exists() and sum(bool(finished.match(line)) for line in log.read_text().splitlines()) >= 2:
            break
    # Killed while a trial is measured: its worker stamped on it. A kill between the study's ask
    # and the stamp (two SQLite commits, milliseconds; hit twice on a loaded machine, where the
    # next ask follows the second row) leaves an unstamped trial that is another worker's for
    # the 60 s grace (tuner.study.records), not this test's case.
    while time.monotonic() < deadline and proc.poll() is None:
        running = [t for t in optuna.load_study(study_name="toy", storage=f"sqlite:///{out / 'study.db'}").trials
                   if t.state == optuna.trial.TrialState.RUNNING]
        if running and all("worker" in t.user_attrs for t in running):
            break
        time.sleep(0.05)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == code
    if sig == signal.SIGINT:
        assert (out / "best.json").exists()  # finished cleanly with what was done
    study = optuna.load_study(study_name="toy", storage=storage)
    left_running = [t.number for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert len(study.trials) < 5  # it was stopped mid-way
    resumed = run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    table = rows(out)
    finished = [r for r in table if r["state"] in ("ok", "pruned")]
    assert len(finished) >= 4
    by_number = {int(r["number"]): r for r in table}  # one row per configuration: not one per trial
    for number in left_running:  # a trial SIGKILL cut short is recorded, never lost
        assert "left running by an interrupted search" in by_number[number]["reason"]


def test_ctrl_c_that_python_drops_still_stops_the_search(toy, tmp_path, monkeypatch):
    """A KeyboardInterrupt raised inside a __del__ is printed and dropped by Python (seen
    in CI inside SQLAlchemy's weakref callback): the search still stops as interrupted."""
    loaded = sys.modules.get("tuner_task_toy")  # the task as the tuner imports it, if it did
    # the fourth build from here: the scan for the largest batch, the baseline, its second run (the
    # noise the prune reads), then a trial
    recipe = toy(task_args={"ctrl_c_in_del": (loaded._builds if loaded else 0) + 4}, steps={"warmup": 1, "measure": 3},
                 space={"micro_batch_size": [2, 4, 8, 16]})
    dropped: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))
    result = tuner.search(recipe, trials=4, out=tmp_path / "run", confirm=0, quiet=True)
    assert dropped == [KeyboardInterrupt]  # Python did drop it
    assert result.stopped == "interrupted" and result.trials == 2, (result.stopped, result.trials)
    assert (tmp_path / "run" / "best.json").exists()


def test_bad_storage_url_is_an_input_error(toy, tmp_path, capsys):
    from tuner.cli import search_main

    assert search_main([str(toy()), "--out", str(tmp_path / "r"), "--storage", "nosuchdb://x/y", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "error: storage: cannot open 'nosuchdb://x/y'" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.alone
def test_eight_trials_match_the_exhaustive_workers_grid_side_by_side(toy, tmp_path):
    """An I/O-latency-bound loader: the search's answer beats the baseline by >= 1.25x and
    is >= 0.92x of the best point of a grid over loader workers, re-measured interleaved.
    Its costs are host waits (3 ms a sample read, 8 ms a forward), the same beside two busy
    processes: with the model's own compute as the step, the same configuration read
    731 to 1240 samples/s there, and the ratio 0.85x."""
    recipe = tuner.load_recipe(toy(task_args={"read_ms": 3.0, "step_ms": 8.0}, steps={"warmup": 2, "measure": 20},
                                   space={"num_workers": [0, 1, 2, 4], "micro_batch_size": [8, 16],
                                          "persistent_workers": True},
                                   baseline={"num_workers": 0}))
    # Workers up to 4 on 2 cores: 8 oversubscribed them and the same configuration then
    # spread by +-30% between measurements, more than the margin checked here.
    # search quality only: no attribution; the finish at its defaults (capped at 2 rounds a
    # question, a change the search measured 11% slower once stayed, undecided: 0.82x)
    result = tuner.search(recipe, trials=8, out=tmp_path / "run", attribute=0, quiet=True)
    assert result.speedup >= 1.25, result.speedup
    points = {w: tuner.measure(recipe, num_workers=w) for w in (0, 1, 2, 4)}
    grid = {w: m.metrics["samples_per_s"] for w, m in points.items()}
    grid_best = max(grid, key=grid.get)

    def knobs(params: dict) -> dict:
        return {k: v for k, v in params.items() if k not in ("grad_accum_steps", "engine")}

    found = knobs(result.best["params"])
    if found == knobs(points[grid_best].params):
        return  # the grid's best itself: 1.0 by identity (measuring it twice only measures the order)
    ours, theirs = [], []
    for i in range(4):  # ABBA: a fresh loader measured first in a pair read 10% low in a loaded CI run
        pair = [("ours", found), ("theirs", {"num_workers": grid_best})]
        for side, kw in (pair if i % 2 == 0 else pair[::-1]):
            (ours if side == "ours" else theirs).append(tuner.measure(recipe, **kw).metrics["samples_per_s"])
    ratio = statistics.median(ours) / statistics.median(theirs)
    # the search's own account on failure: a CI run under xdist answered micro-batch 8 with 4
    # workers, re-measured at 0.30x of micro-batch 16 (1 of 4 full runs; not reproduced in 7
    # searches beside two busy processes and two other searches, all answering micro-batch 16)
    log = (tmp_path / "run" / "search.log").read_text()[-6000:]
    assert ratio >= 0.92, (str(found), grid, ours, theirs, log)


@pytest.mark.slow
@pytest.mark.alone
def test_a_search_that_has_converged_stops_before_its_budget(toy, tmp_path):
    """Steady steps (a fixed wait per forward, reads of 0.5 ms a sample): once the
    neighbourhood of the best is measured, sampler trials bring nothing new and the search
    says it converged; --full-budget (budget.converge: false) spends every trial instead.
    Every configuration but the best is slower by construction (a micro-batch of 8 runs two
    forwards a step where 16 runs one; without a worker the reads add to the step), so the
    rule can show each no gain on a busy machine too: with cached data and the loader's
    prefetch, persistence and amp (equals on this task) in the space, another test file and
    two busy processes beside it left every equal undecided, and the space ran out first."""
    recipe = toy(task_args={"read_ms": 0.5, "step_ms": 12}, steps={"warmup": 1, "measure": 12},
                 space={"num_workers": [0, 1], "micro_batch_size": [1, 2, 4, 8, 16]},
                 baseline={"num_workers": 0, "micro_batch_size": 16})
    # the finish at its defaults: with confirm=1 (one round a question) a finalist 2x slower by
    # construction stayed the answer once in a quiet CI run (c6b9ef8), the rule undecided at its limit
    result = tuner.search(recipe, trials=30, out=tmp_path / "a", attribute=0, quiet=True)
    assert result.stopped == "converged" and result.trials < 10, (result.stopped, result.trials)  # of 10
    log = (tmp_path / "a" / "search.log").read_text()
    assert "converged: the neighbourhood of the best is measured" in log
    assert result.best["params"]["micro_batch_size"] == 16
    rows = list(csv.DictReader((tmp_path / "a" / "trials.csv").open()))
    # micro-batch 2 (8x slower) is cut once the run's noise is measured well enough (the rule, on
    # known truths: tests/stats/test_prune.py); one that comes while that noise rests on the
    # baseline's two runs (t = 63.7) runs to its end. Whatever was cut is counted and said.
    cut = [r for r in rows if r["state"] == "pruned"]
    assert result.pruned == len(cut) and (not cut or ("pruning cut" in log and result.pruning_saved_s > 0))
    saved = json.loads((tmp_path / "a" / "best.json").read_text())["pruning"]
    assert saved["trials"] == result.pruned and saved["saved_s"] == pytest.approx(result.pruning_saved_s)
    # --full-budget: the same study goes on past the point where it had converged
    more = tuner.search(recipe, trials=result.trials + 1, out=tmp_path / "a", confirm=0, attribute=0, quiet=True,
                        full_budget=True)
    assert more.stopped in ("trials", "exhausted") and more.trials == result.trials + 1
