"""tuner.Probe in a loop the tuner does not own, checked against what the loop recorded."""

from __future__ import annotations

import time

import pytest
import torch

import tuner


def test_probe_data_wait_matches_the_recorded_truth():
    """Each batch takes ~8 ms to arrive and each step ~4 ms of work; the truth is what the
    loop itself recorded in this run, not a timing taken elsewhere."""
    waits: list[float] = []

    def slow_batches():
        while True:
            start = time.perf_counter()
            time.sleep(0.008)
            waits.append(time.perf_counter() - start)
            yield torch.ones(4, 2)

    probe = tuner.Probe(warmup=2, measure=10)
    steps = 0
    window_begin = None
    for batch in probe.loader(slow_batches()):
        time.sleep(0.004)
        probe.step()
        steps += 1
        if steps == 2:
            window_begin = len(waits)
        if probe.done:
            break
    assert steps == 12 and probe.done
    summary = probe.summary()
    truth_wait = sum(waits[window_begin:])
    truth_share = truth_wait / probe.window.wall_s
    assert summary["data_wait_share"] == pytest.approx(truth_share, abs=0.05)
    assert 0.4 < summary["data_wait_share"] < 0.9
    assert probe.window.samples == [4] * 10  # inferred from the leading dimension
    assert summary["samples_per_s"] == pytest.approx(4 / (probe.window.wall_s / 10), rel=0.05)


def test_probe_without_a_window_size_measures_every_step_after_warmup():
    probe = tuner.Probe(warmup=1)
    for i, batch in enumerate(probe.loader([torch.zeros(3, 1)] * 6)):
        probe.step()
    assert not probe.done
    summary = probe.summary()
    assert len(probe.window.step_times) == 5
    assert summary["step_time_p50_s"] >= 0


def test_probe_summary_before_any_step_says_what_to_do():
    with pytest.raises(RuntimeError, match="call probe.step"):
        tuner.Probe().summary()
