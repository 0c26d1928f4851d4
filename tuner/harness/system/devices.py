"""Which device a measurement is about.

A probe on a GPU node must time the GPU's stream and read its allocator, not the host clock
and the host's PSS, to be compared with a GPU memory budget. These helpers pick the device
the way the training loop does.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import torch


def cuda_index(device: torch.device | str | None) -> torch.device | None:
    """``device`` as a ``torch.device``; ``cuda`` with its index (the current device's when
    none is given: CUDA events and memory counters are per device)."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def default_device() -> torch.device | None:
    """This rank's CUDA device when CUDA is available (:func:`rank_device`), else ``None``
    (the host clock)."""
    return rank_device() if torch.cuda.is_available() else None


def rank_device() -> torch.device:
    """The CUDA device this process trains on: the current one, unless that is still the
    default ``cuda:0`` while torchrun's ``LOCAL_RANK`` names another visible device (a
    script that moves its model to ``cuda:{local_rank}`` without ``set_device``: every rank
    would otherwise time device 0's stream, which runs none of its work)."""
    current = torch.cuda.current_device()
    local = os.environ.get("LOCAL_RANK")
    if current == 0 and local is not None and local.isdigit() and 0 < int(local) < torch.cuda.device_count():
        return torch.device("cuda", int(local))
    return torch.device("cuda", current)


def accelerator_of(parameters: Iterable[Any]) -> torch.device | None:
    """The device of the first parameter that lives on an accelerator: under optimizer
    offload the optimizer's first parameters (or their fp32 copies) sit on the CPU, while
    the model trains on the GPU. ``None`` when every parameter is on the host."""
    for p in parameters:
        device = getattr(p, "device", None)
        if device is not None and device.type not in ("cpu", "meta"):
            return cuda_index(device)
    return None


def room(device: torch.device | None = None) -> int:
    """Bytes this process can have on its CUDA device: what the device has free now
    (``cudaMemGetInfo``, which sees the CUDA context, NCCL's buffers and every other
    process) plus what this process already holds there (NVML's count for this process:
    context and allocator reserve; the allocator's reserve where NVML cannot say). The
    card's total memory is not room: an 80 GiB card with a 0.5 GiB context and another
    job's 10 GiB has 69.5 GiB of it."""
    index = cuda_index(device or "cuda")
    assert index is not None
    free, _ = torch.cuda.mem_get_info(index)
    from tuner.harness.system.nvml import own_device_bytes

    own = own_device_bytes(index.index if index.index is not None else torch.cuda.current_device())
    return int(free) + max(int(torch.cuda.memory_reserved(index)), own or 0)


def least_room(device: torch.device) -> int:
    """:func:`room` on every rank, the least of them (a collective): a budget that holds on
    the busiest GPU of the job (a node where another job holds one GPU's memory)."""
    from tuner.harness import distributed

    return min(distributed.all_gather(room(device)))
