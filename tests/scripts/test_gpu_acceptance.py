"""``scripts/gpu_acceptance.py`` on a machine without CUDA, and the parts of it a CPU can check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tuner

from conftest import write_recipe

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_acceptance.py"


def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "t.json")], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "t.json").exists()


def test_its_task_trains_under_the_tuner_and_its_analytic_flops_are_the_counted_ones(tmp_path):
    """The checks measure this file as a task: it loads and trains as one, and the FLOP
    truth it holds the tuner to (6 x the linear layers' weights a sample) is the count
    FlopCounterMode makes of the same model here."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_acceptance
    finally:
        sys.path.remove(str(SCRIPT.parent))
    recipe = write_recipe(tmp_path, {"name": "acceptance", "task": str(SCRIPT), "task_args": {"width": 64},
                                     "global_batch_size": 32, "steps": {"warmup": 1, "measure": 4}})
    m = tuner.measure(recipe)
    assert m.state == "ok", m.reason
    counted = m.metrics["achieved_tflops"] * 1e12 / m.metrics["samples_per_s"]
    assert counted == pytest.approx(gpu_acceptance.analytic_flops_per_sample(64), rel=0.01)
