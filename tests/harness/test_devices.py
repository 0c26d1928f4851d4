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
