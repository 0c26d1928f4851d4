"""Metric definitions: percentiles, reduction over ranks, names."""

from __future__ import annotations

import pytest

from tuner.harness.metrics import GIB, METRIC_NAMES, Window, percentile, summarize


def test_percentile_matches_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0, 5.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 90) == pytest.approx(4.6)
    assert percentile(xs, 100) == 5.0 and percentile(xs, 0) == 1.0


def test_summary_takes_the_slowest_rank_per_step():
    a = Window(step_times=[0.1, 0.3], data_waits=[0.05, 0.05], samples=[8, 8], wall_s=0.4, cpu_s=0.2,
               peak_host_bytes=GIB)
    b = Window(step_times=[0.2, 0.2], data_waits=[0.0, 0.0], samples=[8, 8], wall_s=0.4, cpu_s=0.4,
               peak_host_bytes=2 * GIB)
    m = summarize([a, b], tokens_per_sample=10)
    assert list(m) == list(METRIC_NAMES)
    assert m["step_time_max_s"] == 0.3 and m["step_time_p50_s"] == pytest.approx(0.25)
    assert m["samples_per_s"] == pytest.approx(16 / 0.25)
    assert m["tokens_per_s"] == pytest.approx(160 / 0.25)
    assert m["data_wait_share"] == pytest.approx(0.25)
    assert m["cpu_util"] == pytest.approx(1.0)
    assert m["peak_mem_gib"] == m["host_mem_gib"] == pytest.approx(2.0)
    assert m["comm_share"] is None and m["mfu"] is None
    assert m["stall_free_samples_per_s"] is None  # not measured in these windows


def test_stall_free_ceiling_uses_the_slowest_rank_per_step():
    a = Window(step_times=[0.2, 0.2], data_waits=[0.1, 0.1], samples=[8, 8], wall_s=0.4, cpu_s=0.1,
               stall_free_step_times=[0.1, 0.05])
    b = Window(step_times=[0.2, 0.2], data_waits=[0.1, 0.1], samples=[8, 8], wall_s=0.4, cpu_s=0.1,
               stall_free_step_times=[0.05, 0.1])
    m = summarize([a, b])
    assert m["stall_free_samples_per_s"] == pytest.approx(16 / 0.1)
    assert m["samples_per_s"] == pytest.approx(16 / 0.2)


def test_device_memory_wins_over_host_when_present():
    w = Window(step_times=[1.0], data_waits=[0.0], samples=[1], wall_s=1.0, cpu_s=0.5,
               peak_host_bytes=GIB, peak_device_bytes=3 * GIB)
    m = summarize([w])
    assert m["peak_mem_gib"] == pytest.approx(3.0) and m["host_mem_gib"] == pytest.approx(1.0)
