"""Shared helpers: recipes written to a temp folder, the real commands run in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

TESTS = Path(__file__).parent
ROOT = TESTS.parent
TOY = TESTS / "tasks" / "toy.py"


def write_recipe(folder: Path, body: dict[str, Any] | str, name: str = "recipe.yaml") -> Path:
    path = folder / name
    path.write_text(body if isinstance(body, str) else yaml.safe_dump(body, sort_keys=False))
    return path


def toy_recipe(folder: Path, **fields: Any) -> Path:
    """A valid recipe on the toy task; ``fields`` replace top-level keys."""
    body: dict[str, Any] = {
        "name": "toy",
        "task": str(TOY),
        "task_args": {"read_ms": 0.0},
        "global_batch_size": 16,
        "steps": {"warmup": 2, "measure": 6},
    }
    body.update(fields)
    return write_recipe(folder, body)


def run(cmd: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=full_env)


def torchrun(nproc: int, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                "--standalone", *args], timeout=timeout)


@pytest.fixture
def toy(tmp_path: Path):
    return lambda **fields: toy_recipe(tmp_path, **fields)
