"""CUDA-only lines run on this CPU against autospecs of the real modules: a misspelled name
or a wrong signature fails here, where the ``torch.cuda.is_available()`` guard hides it
from every other CPU test. Nothing measured under the autospec is a measurement."""

from __future__ import annotations

from unittest import mock

import torch

from tuner.harness.system import nvml


def test_the_allocators_reserve_is_read_through_the_real_torch_cuda_api():
    """``torch.cuda.memoryreserved_bytes`` (no such function) made the NVML sampler thread die
    on its first tick on a GPU, blanking gpu_util and every GPU memory figure."""
    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value = True
    cuda.is_initialized.return_value = True
    cuda.memory_reserved.return_value = 3 * 2**30
    with mock.patch.object(torch, "cuda", cuda):
        assert nvml.reserved_bytes(0) == 3 * 2**30
        assert nvml.reserved_bytes(None) == 0
    cuda.memory_reserved.assert_called_once_with(0)


def _gpu(reserved: int = 2**30, own: int = 3 * 2**30) -> tuple[mock.MagicMock, mock.MagicMock]:
    """Autospecs of the real ``torch.cuda`` and ``pynvml``: a GPU that says this process holds
    ``own`` bytes (NVML) of which its allocator reserved ``reserved``."""
    import os

    import pynvml

    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value = cuda.is_initialized.return_value = True
    cuda.get_device_properties.return_value.uuid = "GPU-0000"
    cuda.memory_reserved.return_value = reserved
    cuda.current_device.return_value = 0
    cuda.device_count.return_value = 1
    cuda.mem_get_info.return_value = (60 * 2**30, 80 * 2**30)
    nvml = mock.create_autospec(pynvml, instance=False)
    nvml.NVMLError = pynvml.NVMLError
    nvml.nvmlDeviceGetHandleByUUID.return_value = "handle"
    nvml.nvmlDeviceGetUtilizationRates.return_value = mock.Mock(gpu=50)
    nvml.nvmlDeviceGetMemoryInfo.return_value = mock.Mock(used=20 * 2**30)
    nvml.nvmlDeviceGetComputeRunningProcesses.return_value = [mock.Mock(pid=os.getpid(), usedGpuMemory=own)]
    return cuda, nvml


def test_the_nvml_sampler_thread_survives_its_first_tick_and_records():
    """The sampler thread that died on the typo's first tick: now it samples on, and gives
    utilization, the device's used memory and this process's own (NVML's count)."""
    import time

    from tuner.harness.system.monitors import GpuUtil

    cuda, nvml = _gpu()
    with mock.patch.object(torch, "cuda", cuda), mock.patch.dict("sys.modules", {"pynvml": nvml}):
        gpu = GpuUtil(0, interval=0.005).start()
        deadline = time.monotonic() + 5
        while len(gpu.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        alive = gpu._thread is not None and gpu._thread.is_alive()  # the thread under test
        gpu.stop()
    assert alive and len(gpu.samples) >= 3 and gpu.samples[0][1] == 0.5
    assert gpu.peak_used == 20 * 2**30 and gpu.peak_own == 3 * 2**30
    nvml.nvmlDeviceGetHandleByUUID.assert_called_with("GPU-0000")
    cuda.memory_reserved.assert_called_with(0)


def test_the_device_budget_is_the_free_memory_plus_what_this_process_holds():
    """The room a trial has on its GPU: cudaMemGetInfo's free bytes (context, NCCL and other
    processes already out) plus this process's own, NVML's count where larger than the
    allocator's reserve."""
    from tuner.harness.system.devices import room

    cuda, nvml = _gpu(reserved=2**30, own=3 * 2**30)
    with mock.patch.object(torch, "cuda", cuda), mock.patch.dict("sys.modules", {"pynvml": nvml}):
        assert room(torch.device("cuda", 0)) == 60 * 2**30 + 3 * 2**30
    cuda.mem_get_info.assert_called_once_with(torch.device("cuda", 0))


def test_a_one_process_search_claims_no_gpu_before_a_trial_needs_it(monkeypatch):
    """``torch.cuda.set_device`` opens a CUDA context (CUDA 12): a script-mode search, which
    trains nothing in its own process, held ~0.5 GiB of GPU 0 for its whole run. One process
    keeps the default device without the call; under torchrun each rank still claims its own."""
    from tuner.harness import distributed

    cuda, _ = _gpu()
    cuda.device_count.return_value = 8
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with mock.patch.object(torch, "cuda", cuda):
        ctx = distributed.context()
    assert ctx.device == torch.device("cuda", 0) and ctx.world_size == 1
    cuda.set_device.assert_not_called()
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(distributed, "ensure_process_group", lambda device: None)
    with mock.patch.object(torch, "cuda", cuda):
        ctx = distributed.context()
    cuda.set_device.assert_called_once_with(torch.device("cuda", 3))
