"""Workers sharing a GPU node get disjoint GPUs (the lock files' arithmetic, without GPUs:
the entries are ``CUDA_VISIBLE_DEVICES`` names, and nothing here reads a device)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tuner.config.errors import RecipeError
from tuner.config.gpus import default_nproc, visible
from tuner.scriptmode.gpus import Claim


def test_workers_on_one_node_claim_disjoint_gpus_until_none_are_left(tmp_path):
    node = ["0", "1", "2", "3"]
    first, second = Claim(node, 2, tmp_path), Claim(node, 2, tmp_path)
    assert first.devices == ["0", "1"] and second.devices == ["2", "3"]
    assert second.env() == {"CUDA_VISIBLE_DEVICES": "2,3"}
    with pytest.raises(RecipeError, match=r"2 GPUs needed, but 4 of this node's 4 visible GPUs are held") as info:
        Claim(node, 2, tmp_path)
    assert "\n" not in str(info.value)
    first.release()
    assert Claim(node, 2, tmp_path).devices == ["0", "1"]  # a finished worker's GPUs are free again


def test_a_killed_workers_gpus_are_free_at_once(tmp_path):
    """The kernel drops a dead process's locks: no stale claim outlives a SIGKILL."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from tuner.scriptmode.gpus import Claim; "
        f"c = Claim(['0', '1'], 2, Path({str(tmp_path)!r})); print('held', flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RecipeError):
            Claim(["0", "1"], 1, tmp_path)
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            assert Claim(["0", "1"], 2, tmp_path).devices == ["0", "1"]
            break
        except RecipeError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_the_visible_gpus_are_cuda_visible_devices_own_entries(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, GPU-8f0e, 5")
    assert visible() == ["2", "GPU-8f0e", "5"] and default_nproc() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible() == [] and default_nproc() == 1  # no GPU: one rank, as before
