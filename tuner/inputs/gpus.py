"""The GPUs of this node as NVML sees them, without creating a CUDA context.

A script recipe's search process never trains, so it must not hold a CUDA context (a few
hundred MiB of GPU 0 for the whole search): here the GPUs are counted and read through NVML
only. ``nproc_per_node`` defaults to :func:`default_nproc`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any


def _nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no driver, no library: no GPU to count
        return None


def visible() -> list[str]:
    """The GPUs a trial may use, as ``CUDA_VISIBLE_DEVICES`` entries: that variable's own
    entries when it is set, else every GPU NVML lists (``"0"``, ``"1"``, ...)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [e.strip() for e in env.split(",") if e.strip() and e.strip() != "-1"]
    nvml = _nvml()
    if nvml is None:
        return []
    try:
        return [str(i) for i in range(nvml.nvmlDeviceGetCount())]
    except Exception:  # noqa: BLE001 - NVML without devices
        return []


def default_nproc() -> int:
    """``nproc_per_node`` when a script recipe does not say: one rank per visible GPU."""
    return len(visible()) or 1


def _handle(entry: str) -> Any:
    """NVML's handle for a ``CUDA_VISIBLE_DEVICES`` entry (an index or a ``GPU-`` UUID);
    ``None`` for what NVML cannot read per device (MIG instances)."""
    nvml = _nvml()
    if nvml is None or entry.startswith("MIG-"):
        return None
    try:
        if entry.startswith("GPU-"):
            return nvml.nvmlDeviceGetHandleByUUID(entry)
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    except Exception:  # noqa: BLE001 - an entry NVML does not know: not checked
        return None


def used_bytes(entries: list[str], less: frozenset[int] = frozenset()) -> dict[str, int]:
    """NVML's used memory of each GPU it can read, less what NVML's list of compute processes
    gives the processes ``less`` (by PID; one NVML does not list by these PIDs, as from
    inside a container's PID namespace, is not taken off)."""
    nvml = _nvml()
    out: dict[str, int] = {}
    for entry in entries:
        handle = _handle(entry)
        if handle is None:
            continue
        with contextlib.suppress(Exception):
            out[entry] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        if less and entry in out:
            with contextlib.suppress(Exception):
                out[entry] -= sum(int(p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                                  if p.pid in less and isinstance(p.usedGpuMemory, int))
    return out
