"""Trials in one process: real DataLoader workers, failures recorded, nothing leaking."""

from __future__ import annotations

import json
import sys
import threading

import psutil
import pytest

import tuner
from conftest import run
from tuner.metrics import METRIC_NAMES


def test_loader_workers_speed_up_a_latency_bound_dataset(toy):
    # 16 reads of 1 ms per step: with no workers the loop waits for all of them.
    recipe = toy(task_args={"read_ms": 1.0}, steps={"warmup": 3, "measure": 10})
    serial = tuner.measure(recipe, num_workers=0)
    parallel = tuner.measure(recipe, num_workers=4, prefetch_factor=4)
    assert serial.state == parallel.state == "ok"
    ratio = parallel.metrics["samples_per_s"] / serial.metrics["samples_per_s"]
    assert ratio >= 1.25, ratio
    assert serial.metrics["data_wait_share"] > 0.5  # the loop mostly waited for reads
    assert parallel.metrics["data_wait_share"] < serial.metrics["data_wait_share"]


def test_metrics_are_complete_and_consistent(toy):
    m = tuner.measure(toy(), repeats=2)
    assert m.state == "ok" and m.failures == 0 and len(m.repeats) == 2
    assert list(m.metrics) == list(METRIC_NAMES)
    x = m.metrics
    assert 0 < x["step_time_p50_s"] <= x["step_time_p90_s"] <= x["step_time_p99_s"] <= x["step_time_max_s"]
    assert 0.0 <= x["data_wait_share"] <= 1.0
    assert x["peak_mem_gib"] > 0.05 and x["host_mem_gib"] == x["peak_mem_gib"]  # CPU: host PSS
    assert x["gpu_util"] is None and x["tokens_per_s"] is None
    for name, (lo, hi) in m.spread.items():
        assert lo <= m.metrics[name] <= hi
    for r in m.repeats:
        assert r.timings["build"] >= 0 and r.timings["measure"] > 0 and r.timings["teardown"] >= 0
    assert m.environment["world_size"] == 1 and m.environment["torch"]


def test_trial_leaves_no_workers_and_no_threads(toy):
    before = threading.active_count()
    m = tuner.measure(toy(), num_workers=3, persistent_workers=True)
    assert m.state == "ok"
    assert psutil.Process().children(recursive=True) == []
    assert threading.active_count() == before


def test_a_b_a_gives_a_back(toy):
    """Measuring B in between must not change A: same throughput within noise, same memory."""
    recipe = toy(task_args={"read_ms": 0.5, "width": 256}, steps={"warmup": 3, "measure": 12})
    a = dict(num_workers=2, micro_batch_size=8)
    b = dict(num_workers=4, micro_batch_size=16, amp_dtype="bf16", prefetch_factor=8)
    first = tuner.measure(recipe, **a)
    tuner.measure(recipe, **b)
    again = tuner.measure(recipe, **a)
    ratio = again.metrics["samples_per_s"] / first.metrics["samples_per_s"]
    assert 0.6 < ratio < 1.6, ratio
    # Memory that B left behind would show here; 10% covers allocator noise.
    assert again.metrics["peak_mem_gib"] <= first.metrics["peak_mem_gib"] * 1.10


@pytest.mark.parametrize("fail, state, reason", [
    ("oom", "oom", "out of memory"),
    ("nan", "nonfinite", "NaN or inf"),
    ("crash", "error", "ValueError: the task's loss broke at "),
    ("empty", "error", "yields no full micro-batch of 16"),
])
def test_failures_are_recorded_with_their_reason(toy, fail, state, reason):
    recipe = toy(task_args={"fail": fail})
    m = tuner.measure(recipe, num_workers=1)
    assert m.state == state and reason in m.reason
    assert m.metrics is None and m.failures == 1
    assert psutil.Process().children(recursive=True) == []
    assert tuner.measure(toy(), num_workers=1).state == "ok"  # the next trial is unaffected


def test_measure_command_prints_json_with_design_names(toy):
    proc = run([sys.executable, "-m", "tuner.measure", str(toy()), "--set", "num_workers=1",
                "--repeats", "2", "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # stdout is the JSON and nothing else
    assert list(out["metrics"]) == list(METRIC_NAMES)
    assert out["params"]["num_workers"] == 1 and out["params"]["grad_accum_steps"] == 1
    assert len(out["repeats"]) == 2 and out["failures"] == 0
    assert set(out["environment"]) == {"torch", "cuda", "deepspeed", "python", "device", "device_count",
                                       "world_size", "cpu_count", "hostname"}


def test_measure_command_prints_a_table_and_notes(toy):
    proc = run([sys.executable, "-m", "tuner", "measure", str(toy()), "--set", "pin_memory=true"])
    assert proc.returncode == 0, proc.stderr
    assert "samples_per_s" in proc.stdout and "step_time_p99_s" in proc.stdout
    if "cuda" not in proc.stderr.lower():
        assert "pin_memory=true cannot apply here" in proc.stderr


def test_failed_measure_exits_1_and_still_reports(toy):
    proc = run([sys.executable, "-m", "tuner.measure", str(toy(task_args={"fail": "oom"})), "--json"])
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["state"] == "oom" and out["metrics"] is None


def test_stall_free_ceiling_matches_back_to_back_steps(toy):
    """Reads of 1 ms x 16 samples per step and 4 ms of work per step: the loop waits on
    data, and the stall-free ceiling (the same step on a batch already in memory) is what
    the task's own record of back-to-back forwards says, within 20%."""
    import sys as _sys

    recipe = toy(task_args={"read_ms": 1.0, "step_ms": 4.0}, steps={"warmup": 2, "measure": 10})
    m = tuner.measure(recipe, num_workers=0)
    assert m.state == "ok"
    forwards = _sys.modules["tuner_task_toy"].FORWARDS
    ceiling_starts = forwards[-10:]  # the last 10 forwards are the stall-free steps (accum 1)
    truth_step = (ceiling_starts[-1] - ceiling_starts[0]) / (len(ceiling_starts) - 1)
    truth = 16 / truth_step
    ceiling = m.metrics["stall_free_samples_per_s"]
    assert ceiling == pytest.approx(truth, rel=0.20), (ceiling, truth)
    assert ceiling > 1.5 * m.metrics["samples_per_s"]  # the data pipeline is what holds it back
