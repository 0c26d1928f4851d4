"""``tuner check RECIPE --rev REV``: the recipe's task at a git revision against the working
tree, each measurement a fresh process, interleaved, paired. Held on a job whose costs are
known by construction (a 20 ms host wait a step, the same in any process on a busy
machine): a training step that gains a log line costing 10% of it fails, unchanged code
passes, and what cannot be gated is refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tuner.outputs import wording

from conftest import GIT_JOB, commit_job, run

LOG_LINE = (  # a log line flushed to a slow sink: 10% of the step as it runs here, busy or quiet
    "    now, seen = time.perf_counter(), globals()\n"
    "    step = now - seen['_prev'] - seen['_slept'] if '_prev' in seen else STEP_S\n"
    "    seen['_prev'], seen['_slept'] = now, 0.10 * step\n"
    "    time.sleep(seen['_slept'])\n")
"""A fixed 2 ms (10% of the 20 ms wait) read 7.3% of a step that load had lengthened, beside
two busy processes: undecided against the 5% tolerance after 20 rounds. The line now costs
10% of the step it is in: the interval between its calls, less its own last sleep."""
RECIPE = """name: job
task: job.py
global_batch_size: 8
steps: {warmup: 2, measure: 20}
"""


@pytest.fixture
def repo(tmp_path):
    """A user's repository: the job and its recipe committed."""
    return commit_job(tmp_path, RECIPE)


def check(repo, *args):
    return run([sys.executable, "-m", "tuner.check", str(repo / "job.yaml"), *args], timeout=900)


@pytest.mark.slow
def test_a_step_that_gains_a_ten_percent_log_line_fails_and_unchanged_code_passes(repo):
    same = check(repo, "--rev", "HEAD")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "PASS within tolerance: the working tree against HEAD" in same.stdout
    (repo / "job.py").write_text(GIT_JOB.format(log_line=LOG_LINE))
    slower = check(repo, "--rev", "HEAD")
    assert slower.returncode == 1, slower.stdout + slower.stderr
    assert "FAIL regression: the working tree against HEAD" in slower.stdout and "pairs" in slower.stdout
    assert "round 1:" in slower.stderr  # each round said as it comes
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1  # the revision's worktree is gone


@pytest.mark.slow  # 11 s on a quiet machine: a worktree and fresh processes
def test_what_cannot_be_gated_is_one_line(repo, tmp_path_factory):
    unknown = check(repo, "--rev", "no-such-branch")
    assert unknown.returncode == 2 and "--rev no-such-branch: no such commit" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    loose = tmp_path_factory.mktemp("loose")
    (loose / "job.py").write_text(GIT_JOB.format(log_line=""))
    (loose / "job.yaml").write_text(RECIPE)
    outside = run([sys.executable, "-m", "tuner.check", str(loose / "job.yaml"), "--rev", "HEAD"])
    assert outside.returncode == 2 and "is not inside a git repository" in outside.stderr
    both = check(repo, "--rev", "HEAD", "--absolute")
    assert both.returncode == 2 and "--absolute and --process-noise go with --against" in both.stderr


def test_the_verdict_reads_pairs_and_says_how_many_more_rounds_would_decide():
    from tuner.analysis.gate import rev_verdict

    slow = rev_verdict([100.0, 101.0, 99.0, 100.5], [80.0, 81.0, 79.5, 80.2], 0.05, "abc", "HEAD")
    assert slow.verdict == "regression" and slow.exit_code == 1 and slow.slowdown["pairs"] == 4
    same = rev_verdict([100.0, 101.0, 99.0, 100.5, 100.2], [100.1, 100.8, 99.2, 100.4, 100.0], 0.05)
    assert same.verdict == "pass" and same.exit_code == 0
    near = rev_verdict([100.0, 108.0, 95.0], [95.0, 101.0, 92.0], 0.05, "abc", "HEAD")
    assert near.verdict == "undecided" and near.exit_code == 4 and near.more_rounds is not None
    assert f"about {near.more_rounds} more round(s) would likely decide it" in wording.gate(near)
    gone = rev_verdict([100.0], [], 0.05, failure={"side": "work", "reason": "ValueError: boom"})
    assert gone.verdict == "broken" and gone.exit_code == 1
    assert wording.gate(gone) == "a side no longer runs: work: ValueError: boom"


def test_a_precise_interval_above_the_tolerance_goes_on_to_a_verdict():
    """A gate must say pass or fail: a precise interval that straddles the tolerance is no
    stop for it (beside two busy processes a step 10% slower read 7.1% slower, "+4.9% to
    +9.2%" after 6 rounds, and the gate stopped undecided). 7.1% slower at 1% noise a run:
    stopping on precision failed 89 of 300 gates; the loop the command runs fails all but a
    handful, each within its 20 rounds."""
    import math
    import random

    from tuner.analysis.gate import DEFAULT_REV_ROUNDS, DEFAULT_TOLERANCE
    from tuner.tuning.gate_rounds import rev_rounds

    rng = random.Random("precise")

    def measure(side: str) -> float:
        return (100.0 if side == "rev" else 100.0 / 1.071) * math.exp(rng.gauss(0.0, 0.01))

    gates = [rev_rounds(measure, DEFAULT_TOLERANCE, DEFAULT_REV_ROUNDS) for _ in range(300)]
    assert sum(g.verdict == "regression" for g in gates) >= 290
    assert max(g.rounds for g in gates) <= DEFAULT_REV_ROUNDS


def test_the_ratio_gate_says_undecided_with_its_own_exit_status():
    from tuner.analysis.gate import Recorded, verdict

    noisy = verdict(Recorded([400.0, 404.0, 398.0], [100.0, 101.0, 99.5]), [300.0, 420.0], [100.0, 90.0], 0.05)
    assert noisy.verdict == "undecided" and not noisy.passed and noisy.exit_code == 4
    assert "exit 4" in wording.gate(noisy)
