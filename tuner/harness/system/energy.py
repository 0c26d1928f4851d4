"""Energy over a measured window: each process's own GPU through NVML's total-energy counter,
or on a CPU-only host the Linux powercap (RAPL) package counters, read at the window's ends.

Each reading carries the key of what it counted (:attr:`Energy.key`: the GPU's NVML UUID, or
the host's name), and :func:`tuner.harness.metrics.energy_per_sample` counts each key once:
``energy_j_per_sample`` is the joules of the job's own GPUs, each once, however ranks share
or name them. The powercap packages are read by the host's first process (``LOCAL_RANK`` 0).
Where no counter can be read (no powercap, root-only files, NVML before Volta, a MIG
instance) the figure is ``None`` and :attr:`Energy.why` says why: never a zero, never a part.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

POWERCAP = Path("/sys/class/powercap")
MIG_WHY = "a MIG instance has no energy counter of its own (NVML counts the whole GPU)"


@dataclass
class Counter:
    """One cumulative energy counter: read in joules, wrapping at ``wrap_j`` (powercap)."""

    name: str
    read_j: Any
    """() -> joules so far (a callable)."""
    wrap_j: float | None = None


@dataclass
class Energy:
    """Joules this process's counters moved between :meth:`start` and :meth:`stop`."""

    counters: list[Counter] = field(default_factory=list)
    why: str | None = None
    """Why there is no figure where this process should have read one (``None`` when counters
    were found, or when another process reads what this one would)."""
    source: str | None = None
    """``nvml`` or ``powercap``."""
    key: str | None = None
    """What the counters count (a GPU's UUID, ``host:NAME``): counted once however many
    processes read it."""
    _start: list[float] = field(default_factory=list)

    def start(self) -> None:
        self._start = self._read()

    def started(self) -> "Energy":
        self.start()
        return self

    def stop(self) -> float | None:
        """Joules since :meth:`start`, summed over the counters; ``None`` without a reading."""
        if not self.counters or len(self._start) != len(self.counters):
            return None
        end = self._read()
        if len(end) != len(self.counters):
            return None
        total = 0.0
        for c, a, b in zip(self.counters, self._start, end):
            moved = b - a
            if moved < 0 and c.wrap_j:  # the counter wrapped once inside the window
                moved += c.wrap_j
            total += max(0.0, moved)
        return total

    def _read(self) -> list[float]:
        try:
            return [float(c.read_j()) for c in self.counters]
        except Exception as exc:  # noqa: BLE001 - a counter that stops answering gives no figure
            self.why = f"the {self.source} energy counter stopped answering ({exc})"
            self.counters = []
            return []


def gpu_reader(device_index: int) -> Energy:
    """The energy counter of CUDA device ``device_index``, matched in NVML by UUID (a CUDA
    index is not an NVML index), or why not."""
    try:
        import pynvml
    except ImportError:
        return Energy(why="nvidia-ml-py is not installed")
    from tuner.harness.system.nvml import is_mig, nvml_handle
    from tuner.inputs.gpus import nvml_text

    handle = nvml_handle(device_index)
    if handle is None:
        return Energy(why=f"NVML does not find CUDA device {device_index} by its UUID")
    if is_mig(handle):
        return Energy(why=MIG_WHY)
    try:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # refused before Volta: no figure
        uuid = nvml_text(pynvml.nvmlDeviceGetUUID(handle))
    except Exception as exc:  # noqa: BLE001 - an old GPU, NVML refused
        return Energy(why=f"NVML gives no energy counter ({exc})")
    return Energy([Counter(uuid, _nvml_joules(pynvml, handle))], None, "nvml", uuid)


def _nvml_joules(pynvml: Any, handle: Any) -> Any:
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0


def powercap_counters(root: Path = POWERCAP) -> tuple[list[Counter], str | None]:
    """The powercap packages' counters (``intel-rapl:N``; subzones ``intel-rapl:N:M`` are
    parts of a package and are not added again), or why not."""
    if not root.is_dir():
        return [], f"{root} does not exist (no RAPL counters here: a VM, or not Linux)"
    zones = sorted(p for p in root.iterdir() if p.name.count(":") == 1 and (p / "energy_uj").exists())
    if not zones:
        return [], f"{root} has no package energy counter"
    counters = []
    for zone in zones:
        try:
            (zone / "energy_uj").read_text()
        except OSError as exc:
            return [], f"{zone / 'energy_uj'} is not readable ({exc.strerror}; root only since Linux 5.10)"
        wrap = _number(zone / "max_energy_range_uj")
        counters.append(Counter(zone.name, _powercap_joules(zone / "energy_uj"),
                                wrap / 1e6 if wrap is not None else None))
    return counters, None


def _powercap_joules(path: Path) -> Any:
    return lambda: int(path.read_text()) / 1e6


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def reader_for(device: torch.device | None, local_rank: int | None = None) -> Energy:
    """This process's energy reader: on CUDA its own GPU's counter (every process reads its
    own; a GPU read by several is counted once by its key), else the host's packages where
    this is the host's first process (``LOCAL_RANK`` 0, or none set) and an empty reader
    with no complaint on the others."""
    if device is not None and device.type == "cuda":
        return gpu_reader(device.index if device.index is not None else torch.cuda.current_device())
    rank = local_rank if local_rank is not None else int(os.environ.get("LOCAL_RANK", "0") or 0)
    if rank != 0:
        return Energy()
    counters, why = powercap_counters()
    return Energy(counters, why, "powercap", f"host:{socket.gethostname()}")


def node_why(cuda: bool) -> str | None:
    """Why this node offers no energy counter to a search (``objective: samples_per_joule``),
    or ``None``: on a GPU node, through NVML alone (a script recipe's search process holds no
    CUDA context), the first GPU this process may use."""
    if not cuda:
        return powercap_counters()[1]
    try:
        import pynvml

        from tuner.harness.system.nvml import is_mig
        from tuner.inputs.gpus import handle, visible

        entries = visible()
        found = handle(entries[0]) if entries else None
        if found is None:
            return "NVML lists no GPU this process may use"
        if is_mig(found):
            return MIG_WHY
        pynvml.nvmlDeviceGetTotalEnergyConsumption(found)
    except Exception as exc:  # noqa: BLE001 - no driver, an old GPU, NVML refused
        return f"NVML gives no energy counter ({exc})"
    return None
