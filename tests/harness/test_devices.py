"""Which device a probe measures: what a CPU-only machine can show of the choice."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import tuner
from tuner.harness.system.devices import accelerator_of, cuda_index, default_device


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only choice")
def test_without_cuda_the_probe_times_the_host_and_its_window_still_measures():
    probe = tuner.Probe()
    assert probe.device is None and default_device() is None
    for _batch in probe.loader([torch.zeros(2, 1)] * 3):
        probe.step()
    assert len(probe.window.step_times) == 3


def test_a_device_with_its_index_is_kept_and_cpu_stays_cpu():
    assert cuda_index("cuda:1") == torch.device("cuda", 1)
    assert cuda_index(torch.device("cpu")) == torch.device("cpu")
    assert cuda_index(None) is None


def test_under_offload_the_training_device_is_the_first_parameter_on_an_accelerator():
    """ZeRO-Offload's optimizer holds fp32 copies on the CPU first; the model trains on the
    GPU. (A parameter's device is all the choice reads: a stand-in names cuda:0 here.)"""
    on_host = torch.nn.Parameter(torch.zeros(2))
    on_gpu = SimpleNamespace(device=torch.device("cuda", 0))
    assert accelerator_of([on_host, on_gpu]) == torch.device("cuda", 0)
    assert accelerator_of([on_host]) is None


def test_the_users_probe_leaves_the_processs_peak_counters_alone_and_the_trials_resets_them():
    from tuner.harness.probe_core import ProbeCore

    assert tuner.Probe()._reset_peaks is False  # torch.cuda.reset_peak_memory_stats is the user's
    assert ProbeCore()._reset_peaks is True  # the tuner's own trial: the window's peak


def test_each_rank_is_on_its_own_device_when_the_script_never_set_one(monkeypatch):
    """torchrun's rank 3 on a node of 8, a script that moves its model to cuda:3 without
    set_device: the current device is still 0, so the probe takes LOCAL_RANK's. With
    set_device (current 3), or one visible GPU per rank, the current device stands."""
    import torch

    from tuner.harness.system.devices import rank_device

    current = {"index": 0}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["index"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert rank_device() == torch.device("cuda", 3)
    current["index"] = 5
    assert rank_device() == torch.device("cuda", 5)
    current["index"] = 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # CUDA_VISIBLE_DEVICES gives each rank one
    assert rank_device() == torch.device("cuda", 0)


def test_a_probe_made_before_set_device_asks_for_its_device_at_the_first_batch():
    """The device is asked once, when the loop starts (after the script's set_device), not
    when the probe is made at the top of the script."""
    from tuner.harness.probe_core import ProbeCore

    asked = []
    probe = ProbeCore(warmup=1, measure=2, device_later=lambda: asked.append(1) or None, monitors=False)
    assert asked == []
    for _ in probe.loader(range(4)):
        probe.step(samples=1)
    assert asked == [1] and probe.device is None
    probe.close()
