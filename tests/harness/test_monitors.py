"""Background samplers: host PSS for real; NVML at its boundary (no GPU on this machine)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import psutil
import pynvml
import torch

from tuner.harness.system.monitors import GpuUtil, HostMemory, pss_bytes


def test_host_memory_sees_an_allocation_and_counts_children_once():
    memory = HostMemory(interval=0.02).start()
    before = memory.sample()
    block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    time.sleep(0.1)
    peak = memory.stop()
    del block
    assert peak - before > 48 * 1024 * 1024
    assert pss_bytes(psutil.Process().pid) <= psutil.Process().memory_info().rss * 1.05


def test_gpu_util_without_a_gpu_reports_nothing_and_never_fails():
    gpu = GpuUtil(None).start()
    gpu.stop()
    assert not gpu.available and gpu.mean(0.0, time.perf_counter()) is None
    if not torch.cuda.is_available():
        assert GpuUtil(0).available is False  # no CUDA: NVML is not even asked


def test_gpu_util_averages_nvml_samples_inside_the_window(monkeypatch):
    """The NVML call is faked (this machine has no GPU); the sampling and the window are real."""
    readings = iter([100, 100, 0, 0] + [50] * 1000)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda handle: SimpleNamespace(gpu=next(readings)))
    used = iter([3 << 30, 5 << 30] + [4 << 30] * 1000)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda handle: SimpleNamespace(used=next(used)))
    gpu = GpuUtil(None, interval=0.01)
    gpu._handle = object()  # what _nvml_handle returns on a GPU machine
    gpu.start()
    time.sleep(0.3)
    gpu.stop()
    assert len(gpu.samples) >= 10  # >= 5 Hz with room to spare
    times = [t for t, _ in gpu.samples]
    assert gpu.mean(times[0], times[3]) == 0.5
    assert gpu.mean(times[4], times[-1]) == 0.5
    assert gpu.mean(times[-1] + 1, times[-1] + 2) is None
    assert gpu.peak_used == 5 << 30  # memory used: the peak of the samples


def test_host_memory_reads_pss_only_when_resident_memory_reaches_a_new_high():
    """A steady process costs the sampler RSS readings only; a growing one is followed."""
    memory = HostMemory(interval=0.01).start()
    time.sleep(0.3)  # ~30 ticks, nothing allocated
    steady = memory.pss_reads
    block = torch.ones(96 * 1024 * 1024 // 4)  # 96 MiB, touched: a new high
    time.sleep(0.1)
    grown = memory.pss_reads
    peak = memory.stop()
    del block
    assert steady <= 3, steady  # the start's reading, and at most a couple of allocator wobbles
    assert grown > steady and peak - pss_bytes(psutil.Process().pid) > 64 * 1024 * 1024


def test_the_process_is_found_on_its_gpu_inside_a_pid_namespace():
    """NVML lists host PIDs; in a container this process is pid 27 and the host's 41234. By
    PID where a namespace shows it, else the only process on the device, else the only one
    that can hold this process's allocator reserve; never a guess between two."""
    from tuner.harness.system.nvml import namespace_pids, pick_own

    gib = 2**30
    assert pick_own([(41234, 3 * gib), (999, 5 * gib)], {27, 41234}) == 3 * gib
    assert pick_own([(41234, 3 * gib)], {27}) == 3 * gib  # alone on its device
    others = [(41234, 3 * gib), (999, gib // 2)]
    assert pick_own(others, {27}, reserved=2 * gib) == 3 * gib  # only it holds 2 GiB
    assert pick_own([(41234, 3 * gib), (999, 5 * gib)], {27}, reserved=2 * gib) is None  # two could
    assert pick_own([], {27}) is None
    import os

    assert os.getpid() in namespace_pids(os.getpid())
