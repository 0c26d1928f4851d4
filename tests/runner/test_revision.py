"""``tuner/runner/revision.py``: the recipe's tree at a git revision in a worktree of its own,
removed afterwards, and one measurement of a side in a fresh process from that side's tree
(its task is the side's own). The whole gate over it: tests/analysis/test_gate_rev.py."""

from __future__ import annotations

import subprocess

import pytest

from tuner.inputs.errors import RecipeError
from tuner.runner.revision import Revision, measure_once

TASK = '''
import torch

SIDE = {side!r}


def build_model(args):
    return torch.nn.Linear(4, 1)


def build_dataset(args):
    return torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))


def compute_loss(model, batch):
    x, y = batch
    if SIDE == "broken":
        raise ValueError("the working tree's task is broken")
    return torch.nn.functional.mse_loss(model(x), y)
'''
RECIPE = "name: job\ntask: job.py\nglobal_batch_size: 8\nsteps: {warmup: 1, measure: 4}\n"


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "job.py").write_text(TASK.format(side="committed"))
    (root / "job.yaml").write_text(RECIPE)
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "the job")
    (root / "job.py").write_text(TASK.format(side="broken"))  # the working tree differs from HEAD
    return root


def _worktrees(root) -> list[str]:
    out = subprocess.run(["git", "worktree", "list"], cwd=root, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()


@pytest.mark.slow  # two fresh processes
def test_the_revision_is_checked_out_beside_the_repository_and_removed_after(repo, tmp_path):
    folder = tmp_path / "rev"
    with Revision(repo / "job.yaml", "HEAD", folder) as rev:
        assert rev.tree == folder and rev.relative.as_posix() == "job.yaml"
        assert "SIDE = 'committed'" in (folder / "job.py").read_text()  # HEAD's file, not the working tree's
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
