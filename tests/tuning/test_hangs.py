"""No hang anywhere: a rank stuck in a trial ends it within the trial's limit, the trial is
recorded ``hung`` with where each rank was, and the same command, run again, resumes the search."""

from __future__ import annotations

import csv
import time

import pytest

from conftest import torchrun

pytestmark = pytest.mark.slow


def test_a_rank_stuck_in_its_forward_is_recorded_hung_and_the_search_resumes(toy, tmp_path):
    """Rank 1's forward never returns in the first trial at micro-batch 8; rank 0 waits in the
    backward's all-reduce. Within the 12 s limit (steps.timeout_s: no trial of that kind had finished
    before) the trial is recorded hung naming both ranks' places and every rank exits with one
    line; the same command then resumes and finishes without running it again."""
    marker = tmp_path / "hung-once"
    recipe = toy(task_args={"hang_at_micro": 8, "hang_rank": 1, "hang_marker": str(marker)},
                 steps={"warmup": 1, "measure": 4, "timeout_s": 12},
                 baseline={"micro_batch_size": 4}, space={"micro_batch_size": [4, 8], "num_workers": [0, 1]},
                 budget={"trials": 4}, out=str(tmp_path / "run"))
    start = time.monotonic()
    args = ("-m", "tuner.search", str(recipe), "--confirm", "0", "--attribute", "0", "--quiet")
    first = torchrun(2, *args, timeout=300)
    wall = time.monotonic() - start
    assert first.returncode != 0 and wall < 90, (first.returncode, wall)  # ended by the limit, not gloo's 10 minutes
    said = [line for line in first.stderr.splitlines() if line.startswith("tuner: hung")]
    assert said and "re-run the same command to resume" in said[0], first.stderr[-3000:]
    assert "max-restarts" not in first.stderr  # advice that was tried and does not work is not given
    again = torchrun(2, *args, timeout=300)  # the same command resumes
    assert again.returncode == 0, again.stderr[-4000:]
    with open(tmp_path / "run" / "trials.csv", newline="") as f:
        trials = [r for r in csv.DictReader(f)]
    hung = [r for r in trials if r["state"] == "hung"]
    assert len(hung) == 1 and hung[0]["micro_batch_size"] == "8", [(r["micro_batch_size"], r["state"]) for r in trials]
    reason = hung[0]["reason"]
    assert "past its 12 s limit" in reason and "rank 1 in compute_loss (toy.py" in reason, reason
    assert "rank 0 in all_reduce" in reason, reason  # waiting for rank 1 in the backward's all-reduce
    configs = [(r["micro_batch_size"], r["num_workers"]) for r in trials]
    assert len(configs) == len(set(configs)) and len(trials) >= 3  # nothing measured twice, the search went on
