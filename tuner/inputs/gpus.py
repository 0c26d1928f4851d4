"""The GPUs of this node as NVML sees them, without creating a CUDA context.

A script recipe's search process never trains, so it must not hold a CUDA context (a few
hundred MiB of GPU 0 for the whole search): here the GPUs are counted and read through NVML
only. ``nproc_per_node`` defaults to :func:`default_nproc`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from tuner.inputs.errors import RecipeError


def _nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no driver, no library: no GPU to count
        return None


def visible() -> list[str]:
    """The GPUs a trial may use, as ``CUDA_VISIBLE_DEVICES`` entries naming each by NVML's
    UUID (``GPU-...``, ``MIG-...``): CUDA numbers GPUs fastest first unless
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML by PCI bus, so an index handed to a trial and read
    back in NVML could be two GPUs. That variable's entries where it is set (indices taken
    to UUIDs where the orders agree, :func:`_uuids`), else every GPU NVML lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = None if env is None else [e.strip() for e in env.split(",") if e.strip()]
    if entries is not None and "-1" in entries:  # CUDA stops at the first invalid entry
        entries = entries[:entries.index("-1")]
    nvml = _nvml()
    if nvml is None:
        return entries or []
    try:
        count = nvml.nvmlDeviceGetCount()
        return _uuids(nvml, entries if entries is not None else [str(i) for i in range(count)], count)
    except RecipeError:
        raise
    except Exception:  # noqa: BLE001 - NVML without devices, an index it does not know: as given
        return entries or []


def _uuids(nvml: Any, entries: list[str], count: int) -> list[str]:
    """``entries`` with each index as its GPU's NVML UUID. An index is CUDA's, which is
    NVML's under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or on a node of one GPU model (fastest
    first then ties, broken by PCI bus); elsewhere the entry cannot be told without a CUDA
    context, and the search says so in one line."""
    if not any(e.isdigit() for e in entries):
        return entries
    if os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        names = {nvml_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)}
        if len(names) > 1:
            raise RecipeError(
                f"CUDA_VISIBLE_DEVICES={','.join(entries)} names GPUs by CUDA's index, which on this node of "
                f"{' and '.join(sorted(names))} need not be NVML's: set CUDA_DEVICE_ORDER=PCI_BUS_ID, or name "
                "the GPUs by UUID (nvidia-smi -L)")
    return [nvml_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(int(e)))) if e.isdigit() else e
            for e in entries]


def nvml_text(value: Any) -> str:
    """An NVML string (bytes in older bindings) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def default_nproc() -> int:
    """``nproc_per_node`` when a script recipe does not say: one rank per visible GPU."""
    return len(visible()) or 1


def handle(entry: str) -> Any:
    """NVML's handle for a ``CUDA_VISIBLE_DEVICES`` entry (a ``GPU-`` or ``MIG-`` UUID, or an
    NVML index); ``None`` for what NVML does not know (an old NVML's ``MIG-GPU-.../gi/ci``
    names)."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        if entry.startswith(("GPU-", "MIG-")):
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
        found = handle(entry)
        if found is None:
            continue
        with contextlib.suppress(Exception):
            out[entry] = int(nvml.nvmlDeviceGetMemoryInfo(found).used)
        if less and entry in out:
            with contextlib.suppress(Exception):
                out[entry] -= sum(int(p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(found)
                                  if p.pid in less and isinstance(p.usedGpuMemory, int))
    return out
