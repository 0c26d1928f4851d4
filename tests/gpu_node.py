"""A GPU node for CPU tests, built on autospecs of the real ``pynvml`` and ``torch.cuda`` (a
misspelled name or a wrong signature fails): NVML lists the node's GPUs in PCI order with
their UUIDs and energy counters; CUDA sees the job's ``visible`` ones, renumbered from 0, as
``CUDA_VISIBLE_DEVICES`` makes it. Nothing read under it is a measurement."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pynvml
import torch


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-0000-0000-000000000000"


def node(gpus: int = 8, visible: tuple[int, ...] | None = None, names: list[str] | None = None,
         mig: dict[int, str] | None = None) -> tuple[mock.MagicMock, mock.MagicMock]:
    """``(nvml, cuda)`` of a node of ``gpus`` GPUs of which CUDA sees ``visible`` (NVML
    indices; all by default). ``mig`` maps an NVML index to the ``MIG-`` UUID CUDA sees in
    its place. Energy counters start at 1,000 J and move 10 J a read on GPU i times (i + 1)."""
    visible = tuple(range(gpus)) if visible is None else visible
    names = names or ["NVIDIA H100 80GB HBM3"] * gpus
    mig = mig or {}
    handles = {uuid(i): f"h{i}" for i in range(gpus)} | {u: f"mig{i}" for i, u in mig.items()}
    reads: dict[str, int] = {}

    nvml = mock.create_autospec(pynvml, instance=False)
    nvml.NVMLError = pynvml.NVMLError
    nvml.nvmlDeviceGetCount.return_value = gpus
    nvml.nvmlDeviceGetHandleByIndex.side_effect = lambda i: f"h{i}" if 0 <= i < gpus else _missing()
    nvml.nvmlDeviceGetHandleByUUID.side_effect = lambda u: handles[u] if u in handles else _missing()
    nvml.nvmlDeviceGetUUID.side_effect = lambda h: next(u for u, v in handles.items() if v == h)
    nvml.nvmlDeviceGetName.side_effect = lambda h: names[int(h[1:])]
    nvml.nvmlDeviceIsMigDeviceHandle.side_effect = lambda h: h.startswith("mig")

    def joules(h: str) -> int:  # millijoules, as NVML counts
        if h.startswith("mig"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        reads[h] = reads.get(h, 0) + 1
        return 1_000_000 + (reads[h] - 1) * 10_000 * (int(h[1:]) + 1)

    nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = joules
    nvml.nvmlDeviceGetUtilizationRates.side_effect = lambda h: (
        _unsupported() if h.startswith("mig") else mock.Mock(gpu=50))
    nvml.nvmlDeviceGetMemoryInfo.return_value = mock.Mock(used=2**30)
    nvml.nvmlDeviceGetComputeRunningProcesses.return_value = []

    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value = cuda.is_initialized.return_value = True
    cuda.device_count.return_value = len(visible)
    cuda.current_device.return_value = 0
    seen = [mig.get(i, uuid(i)).removeprefix("GPU-").removeprefix("MIG-") for i in visible]  # CUDA's bare hex

    def properties(index: Any) -> Any:
        index = index.index if isinstance(index, torch.device) else index
        return mock.Mock(uuid=seen[index])

    cuda.get_device_properties.side_effect = properties
    cuda.memory_reserved.return_value = 0
    return nvml, cuda


def _missing() -> Any:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)


def _unsupported() -> Any:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def patched(nvml: mock.MagicMock, cuda: mock.MagicMock) -> Any:
    """The context both stand in: ``pynvml`` as imported anywhere, ``torch.cuda``."""
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.dict("sys.modules", {"pynvml": nvml}))
    stack.enter_context(mock.patch.object(torch, "cuda", cuda))
    return stack
