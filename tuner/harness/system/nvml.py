"""What NVML says of this process on its GPU: the device's handle, and the process's own
memory there (its CUDA context, the allocator's reserve, NCCL's buffers, cuBLAS's
workspaces), found in NVML's list of compute processes even inside a container's PID
namespace (:func:`pick_own`)."""

from __future__ import annotations

import os
from typing import Any


def process_device_bytes(handle: Any, pid: int, reserved: int = 0) -> int | None:
    """Process ``pid``'s memory on the device of NVML ``handle``, from NVML's list of
    compute processes (:func:`pick_own`; ``None`` when it cannot be told, or NVML gives no
    figure). Raises NVML's error when the list cannot be read."""
    import pynvml

    listed = [(int(p.pid), int(p.usedGpuMemory)) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
              if isinstance(p.usedGpuMemory, int)]
    return pick_own(listed, namespace_pids(pid), reserved)


def namespace_pids(pid: int) -> set[int]:
    """``pid`` in every PID namespace /proc can show (``NSpid`` of /proc/PID/status)."""
    pids = {pid}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    pids |= {int(x) for x in line.split()[1:]}
    except OSError:
        pass
    return pids


def pick_own(listed: list[tuple[int, int]], pids: set[int], reserved: int = 0) -> int | None:
    """This process's bytes among NVML's ``(pid, bytes)`` entries for its device.

    NVML lists processes by the host's PIDs; inside a container with its own PID namespace
    ``os.getpid()`` is another number (and the container's /proc shows no host PID), so
    matching by PID alone gave ``None`` there, and the budget silently lost the CUDA
    context's and NCCL's memory. By elimination then: this process holds a context on its
    device, so it is the only entry, or the only one large enough for what its own
    allocator has reserved (``reserved``); where that leaves several, ``None`` (no guess)."""
    mine = [used for pid, used in listed if pid in pids]
    if mine:
        return mine[0]
    if len(listed) == 1:
        return listed[0][1]
    fits = [used for _, used in listed if used >= reserved > 0]
    return fits[0] if len(fits) == 1 else None


def own_device_bytes(device_index: int) -> int | None:
    """This process's memory on CUDA device ``device_index`` as NVML counts it, or ``None``."""
    handle = nvml_handle(device_index)
    if handle is None:
        return None
    try:
        return process_device_bytes(handle, os.getpid(), reserved_bytes(device_index))
    except Exception:  # noqa: BLE001 - NVML refused: no figure
        return None


def reserved_bytes(device_index: int | None) -> int:
    """What this process's caching allocator holds on the device (0 without one)."""
    import torch

    if device_index is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.memory_reserved(device_index))


def nvml_handle(device_index: int) -> object | None:
    """NVML's handle for CUDA device ``device_index``, matched by UUID (CUDA numbers its
    devices fastest first and after ``CUDA_VISIBLE_DEVICES``, NVML by PCI bus, so an index
    could name another GPU); a MIG instance's own handle (``MIG-`` UUID) where the device is
    one. ``None`` when NVML or the device is not there."""
    try:
        import pynvml
        import torch

        if not torch.cuda.is_available():
            return None
        pynvml.nvmlInit()
        return handle_by_uuid(pynvml, str(torch.cuda.get_device_properties(device_index).uuid))
    except Exception:  # noqa: BLE001 - no driver, no library, an old NVML: no signal
        return None


def handle_by_uuid(pynvml: Any, uuid: str) -> Any:
    """The handle of a UUID as CUDA prints it (bare hex) or NVML does (``GPU-``/``MIG-``):
    a whole GPU's first, then a MIG instance's. Raises NVML's error when neither is known."""
    if uuid.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    except pynvml.NVMLError:
        return pynvml.nvmlDeviceGetHandleByUUID(f"MIG-{uuid}")


def is_mig(handle: Any) -> bool:
    """Whether ``handle`` is a MIG instance's (its memory is its own; utilisation and energy
    NVML gives only for the whole GPU)."""
    try:
        import pynvml

        return bool(pynvml.nvmlDeviceIsMigDeviceHandle(handle))
    except Exception:  # noqa: BLE001 - an NVML before MIG: no instance
        return False
