"""A recipe at a git revision and at the working tree, each measurement a process of its own
(``tuner check --rev``): the revision is checked out in a worktree of its own (``git worktree
add --detach``, removed afterwards), and each side runs ``python -m tuner.measure`` on its
copy of the recipe, from its tree's root with that root first on ``PYTHONPATH`` (the task,
the script and the modules they import are the side's own; the tuner is the installed one).

A process per measurement, not one per side: one process's rate differs from the next's by
a factor its configuration does not explain, so a side living in one process would carry
that factor as a bias. Fresh processes, interleaved and paired, make it noise the interval
counts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tuner.inputs.errors import RecipeError


def git(args: Sequence[str], cwd: Path) -> str:
    """A git command's output (stripped); a failure as :class:`RecipeError` in git's words."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError as exc:
        raise RecipeError("--rev needs git on the PATH") from exc
    if done.returncode != 0:
        raise RecipeError(f"git {' '.join(args)}: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return done.stdout.strip()


@dataclass
class Revision:
    """A worktree of ``rev`` beside the repository holding ``recipe`` (a context manager)."""

    recipe: Path
    rev: str
    folder: Path
    """Where the worktree goes (removed on exit)."""

    def __post_init__(self) -> None:
        here = self.recipe.resolve().parent
        try:
            self.root = Path(git(["rev-parse", "--show-toplevel"], here))
        except RecipeError as exc:
            raise RecipeError(f"--rev: {self.recipe} is not inside a git repository ({exc}); commit the job "
                              "and run the gate from its checkout") from exc
        try:
            self.commit = git(["rev-parse", "--verify", "--quiet", f"{self.rev}^{{commit}}"], self.root)
        except RecipeError as exc:
            raise RecipeError(f"--rev {self.rev}: no such commit in {self.root}; give a branch, tag or commit "
                              "(git log --oneline shows them)") from exc
        self.relative = self.recipe.resolve().relative_to(self.root)
        self.tree: Path | None = None

    def __enter__(self) -> "Revision":
        if self.folder.exists():
            self._remove()
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        git(["worktree", "add", "--detach", "--force", str(self.folder), self.commit], self.root)
        self.tree = self.folder
        if not (self.tree / self.relative).is_file():
            self._remove()
            raise RecipeError(f"--rev {self.rev}: {self.relative} does not exist at {self.commit[:10]}; the gate "
                              "measures the same recipe on both sides")
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove()

    def _remove(self) -> None:
        subprocess.run(["git", "worktree", "remove", "--force", str(self.folder)], cwd=self.root,
                       capture_output=True, timeout=120)
        shutil.rmtree(self.folder, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=self.root, capture_output=True, timeout=120)


def measure_once(tree: Path, recipe: Path, sets: Sequence[str], out: Path, nproc: int, timeout_s: float) -> float | str:
    """One measurement of ``recipe`` (relative to ``tree``) in a fresh process: samples/s, or
    why it did not run (its last error line)."""
    cmd = [sys.executable, "-m", "tuner.measure"] if nproc <= 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "-m", "tuner.measure"]
    cmd += [str(tree / recipe), "--json", "--set", f"out={out}", *[w for s in sets for w in ("--set", s)]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"no result within {timeout_s:.0f} s"
    try:
        result = json.loads(done.stdout[done.stdout.index("{"):]) if "{" in done.stdout else None
    except ValueError:
        result = None
    if not result or not (result.get("metrics") or {}).get("samples_per_s"):
        lines = [line for line in (done.stderr or "").splitlines() if line.strip()]
        why = (result or {}).get("reason") or (lines[-1] if lines else f"exit status {done.returncode}")
        return str(why)[:300]
    return float(result["metrics"]["samples_per_s"])
