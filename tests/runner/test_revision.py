"""``tuner/runner/revision.py``: the recipe's tree at a git revision in a worktree of its own,
removed afterwards, and one measurement of a side in a fresh process from that side's tree
(its task is the side's own). The whole gate over it: tests/analysis/test_gate_rev.py."""

from __future__ import annotations

import subprocess

import pytest

from tuner.inputs.errors import RecipeError
from tuner.runner.revision import Revision, measure_once

from conftest import GIT_JOB, commit_job

BROKEN = '    raise ValueError("the working tree\'s task is broken")\n'
RECIPE = "name: job\ntask: job.py\nglobal_batch_size: 8\nsteps: {warmup: 1, measure: 4}\n"


@pytest.fixture
def repo(tmp_path):
    root = commit_job(tmp_path / "repo", RECIPE)
    (root / "job.py").write_text(GIT_JOB.format(log_line=BROKEN))  # the working tree differs from HEAD
    return root


def _worktrees(root) -> list[str]:
    out = subprocess.run(["git", "worktree", "list"], cwd=root, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()


@pytest.mark.slow  # two fresh processes
def test_the_revision_is_checked_out_beside_the_repository_and_removed_after(repo, tmp_path):
    folder = tmp_path / "rev"
    with Revision(repo / "job.yaml", "HEAD", folder) as rev:
        assert rev.tree == folder and rev.relative.as_posix() == "job.yaml"
        assert "raise ValueError" not in (folder / "job.py").read_text()  # HEAD's file, not the working tree's
        assert len(_worktrees(repo)) == 2
        rate = measure_once(folder, rev.relative, [], tmp_path / "out-rev", 1, 300)
        assert isinstance(rate, float) and rate > 0, rate
    assert not folder.exists() and len(_worktrees(repo)) == 1
    # the working tree's side runs its own task: its error is what comes back, in one line
    why = measure_once(repo, rev.relative, [], tmp_path / "out-work", 1, 300)
    assert isinstance(why, str) and "the working tree's task is broken" in why, why


def test_a_revision_that_is_not_there_or_lacks_the_recipe_is_one_line(repo, tmp_path):
    with pytest.raises(RecipeError, match="--rev nope: no such commit"):
        Revision(repo / "job.yaml", "nope", tmp_path / "rev")
    (repo / "other.yaml").write_text(RECIPE)  # not committed: absent at HEAD
    with pytest.raises(RecipeError, match="other.yaml does not exist at"):
        with Revision(repo / "other.yaml", "HEAD", tmp_path / "rev"):
            pass
    assert not (tmp_path / "rev").exists() and len(_worktrees(repo)) == 1
