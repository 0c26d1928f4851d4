"""Energy over a measured window: the node's GPUs through NVML's total-energy counter, or on a
CPU-only host the Linux powercap (RAPL) package counters, read at the window's two ends.

Two counters, because a GPU node's energy is the GPUs' (an H100 SXM draws up to 700 W against
a few hundred for both host sockets) and a CPU host's is its packages'. The reading covers
**every device of the node**, so only one process a node reads it (torchrun's ``LOCAL_RANK``
0, :func:`reader_for`): eight ranks each reading eight GPUs would count the node eight times.
``energy_j_per_sample`` is then the nodes' joules over every rank's samples
(:func:`tuner.harness.metrics.summarize`).

Where no counter can be read (a VM without powercap, as this project's CI machine; powercap
files readable by root only; NVML before Volta) the figure is ``None`` and :attr:`Energy.why`
says why: never a zero.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")


@dataclass
class Counter:
    """One cumulative energy counter: read in joules, wrapping at ``wrap_j`` (powercap)."""

    name: str
    read_j: Any
    """() -> joules so far (a callable)."""
    wrap_j: float | None = None


@dataclass
class Energy:
    """Joules the node's counters moved between :meth:`start` and :meth:`stop`."""

    counters: list[Counter] = field(default_factory=list)
    why: str | None = None
    """Why there is no figure (``None`` when counters were found)."""
    source: str | None = None
    """``nvml`` or ``powercap``."""
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


def nvml_counters() -> tuple[list[Counter], str | None]:
    """NVML's total-energy counter (millijoules since the driver loaded) of every GPU of the
    node, or why not."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        counters = []
        for i, handle in enumerate(handles):
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # refused before Volta: no figure
            counters.append(Counter(f"gpu{i}", _nvml_joules(pynvml, handle)))
    except Exception as exc:  # noqa: BLE001 - no driver, an old GPU, NVML refused
        return [], f"NVML gives no energy counter ({exc})"
    return counters, None if counters else "NVML lists no GPU"


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


def reader_for(cuda: bool, local_rank: int | None = None) -> Energy:
    """The energy reader of this process: the node's counters where it is the node's first
    process (``LOCAL_RANK`` 0, or none set), else an empty one (another process counts the node)."""
    rank = local_rank if local_rank is not None else int(os.environ.get("LOCAL_RANK", "0") or 0)
    if rank != 0:
        return Energy(why="another process of this node reads its counters")
    counters, why = nvml_counters() if cuda else powercap_counters()
    return Energy(counters, why, "nvml" if cuda else "powercap")
