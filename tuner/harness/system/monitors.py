"""Background samplers that watch a trial without touching its loop.

:class:`HostMemory` samples the proportional set size (PSS) of this process and all its
descendants (DataLoader workers). PSS splits each shared page among the processes that
map it, so forked workers that share the parent's pages are not counted once per worker
the way summed RSS would count them.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil

from tuner.harness.system.nvml import is_mig, nvml_handle, process_device_bytes, reserved_bytes


class _Sampler:
    """A daemon thread that calls :meth:`sample` every ``interval`` seconds until stopped."""

    name = "tuner-sampler"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy_s = 0.0
        """Seconds spent sampling in the thread: what the sampler costs, at most."""

    def sample(self) -> Any:
        raise NotImplementedError

    def tick(self) -> Any:
        """What the thread does every ``interval``: a sample, unless a sampler knows cheaper."""
        return self.sample()

    def _start_thread(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _join(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            start = time.perf_counter()
            result = self.tick()
            self.busy_s += time.perf_counter() - start
            if result is False:  # the source went away: stop quietly
                return


def descendants(pid: int) -> list[int]:
    """Pids of every descendant of ``pid``.

    Read from ``/proc/<pid>/task/<tid>/children`` where Linux has it: psutil's
    ``children()`` scans every process on the machine in Python (1.2 ms here, holding the
    GIL, ten times a second, against the training loop it measures)."""
    out: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            if parent == pid:  # not Linux, or no /proc: ask psutil
                try:
                    return [c.pid for c in psutil.Process(pid).children(recursive=True)]
                except psutil.Error:
                    return []
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            pending.extend(kids)
    return out


def pss_bytes(pid: int) -> int:
    """PSS of one process from ``/proc/<pid>/smaps_rollup`` (RSS where that is missing);
    0 for a process that has exited."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def rss_bytes(pid: int) -> int:
    """Resident set size of one process from ``/proc/<pid>/statm`` (a few microseconds: the
    kernel keeps the count; PSS makes it walk the page tables); 0 once it has exited."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        try:
            return int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def reset_peak_rss() -> bool:
    """Reset this process's resident high-water mark (``VmHWM``) to its current RSS, as
    ``echo 5 > /proc/self/clear_refs`` does (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """This process's resident high-water mark since the last reset (``VmHWM``), exact:
    the kernel keeps it as pages are faulted in."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return None


class HostMemory(_Sampler):
    """Peak PSS of the process tree, sampled every ``interval`` seconds in a thread.

    Reading ``smaps_rollup`` costs the kernel milliseconds a process, so the thread reads the
    tree's resident memory first and PSS only when that reaches a new high by more than
    :data:`RSS_GATE` (the peak is where resident memory peaks); explicit :meth:`sample` calls
    always read PSS. With ``exact_peak`` (the tuner's own trials) the main process's resident
    high-water mark is reset at :meth:`start`, and at :meth:`stop` the highest PSS reading is
    raised by how far resident memory rose above it, so a transient between two ticks counts.
    Off for a user's process (``tuner.Probe``): resetting the mark changes what ``getrusage``
    reports there.
    """

    name = "tuner-host-memory"
    RSS_GATE = 0.01
    """Resident memory must exceed the highest level PSS was read at by this fraction (and
    by 1 MiB) before the thread reads PSS again."""

    def __init__(self, interval: float = 0.5, exact_peak: bool = False) -> None:
        super().__init__(interval)
        self.peak = 0
        self.pss_reads = 0
        """How many times PSS was read (the expensive part), for the overhead benchmark."""
        self._rss_seen = 0
        self._proc = psutil.Process()
        self._exact = exact_peak
        self._at_peak: tuple[int, int] | None = None
        """(tree PSS, main process RSS) at the highest PSS reading."""

    def sample(self) -> int:
        """Read the tree's PSS now (also called at phase boundaries so short trials are seen)."""
        pids = self._tree()
        return self._read_pss(pids, sum(rss_bytes(pid) for pid in pids))

    def tick(self) -> int:
        """The thread's sample: PSS only when resident memory reached a new high."""
        pids = self._tree()
        rss = sum(rss_bytes(pid) for pid in pids)
        if rss <= max(self._rss_seen * (1 + self.RSS_GATE), self._rss_seen + 2**20):
            return self.peak
        return self._read_pss(pids, rss)

    def _tree(self) -> list[int]:
        return [self._proc.pid, *descendants(self._proc.pid)]

    def _read_pss(self, pids: list[int], rss: int) -> int:
        """PSS of ``pids``, remembering the resident level it was read at."""
        self._rss_seen = max(self._rss_seen, rss)
        main_rss = rss_bytes(pids[0]) if self._exact else 0
        value = sum(pss_bytes(pid) for pid in pids)
        self.pss_reads += 1
        if value > self.peak:
            self.peak, self._at_peak = value, (value, main_rss)
        return value

    def start(self) -> "HostMemory":
        self.peak = self._rss_seen = 0
        self._at_peak = None
        self._exact = self._exact and reset_peak_rss()
        self.sample()
        self._start_thread()
        return self

    def stop(self) -> int:
        """Stop sampling and return the peak in bytes."""
        self._join()
        self.sample()
        hwm = peak_rss_bytes() if self._exact else None
        if hwm is not None and self._at_peak is not None:
            pss, main_rss = self._at_peak
            self.peak = max(self.peak, pss + max(0, hwm - main_rss))
        return self.peak


class GpuUtil(_Sampler):
    """NVML utilization of this rank's GPU, sampled every ``interval`` seconds in a thread.

    NVML's "utilization" is the share of time a kernel was running: a liveness signal
    (was the GPU ever idle, waiting on the host?), not SM occupancy. Without CUDA or NVML
    it does nothing and reports ``None``; it never fails a trial.
    """

    name = "tuner-gpu-util"

    def __init__(self, device_index: int | None, interval: float = 0.1) -> None:
        super().__init__(interval)
        self.samples: list[tuple[float, float]] = []
        """(perf_counter time, utilization 0..1)."""
        self.peak_used: int | None = None
        """Peak NVML memory used on the device, bytes (every process's, and the context)."""
        self.peak_own: int | None = None
        """Peak NVML memory of this process on the device, bytes: its CUDA context, the
        allocator's reserve, NCCL's buffers, cuBLAS workspaces (``None`` where NVML does not
        attribute memory to processes, or sees another pid namespace)."""
        self._handle = nvml_handle(device_index) if device_index is not None else None
        self._device_index = device_index
        self._util_ok = self._memory_ok = self._own_ok = True
        self.util_why: str | None = None
        """Why there is no utilisation where the GPU is there (a MIG instance, NVML refused)."""
        if self._handle is not None and is_mig(self._handle):  # memory is the instance's own
            self._util_ok, self.util_why = False, "a MIG instance has no utilisation of its own in NVML"
        self._pid = os.getpid()

    @property
    def available(self) -> bool:
        return self._handle is not None

    def start(self) -> "GpuUtil":
        if self._handle is not None:
            self._start_thread()
        return self

    def stop(self) -> None:
        self._join()

    def mean(self, start: float, end: float) -> float | None:
        """Mean utilization of the samples taken between ``start`` and ``end``."""
        inside = [u for t, u in self.samples if start <= t <= end]
        return sum(inside) / len(inside) if inside else None

    def sample(self) -> bool:
        """One reading of each signal; a signal NVML refuses is dropped alone (utilization
        is not offered on some virtualised GPUs, where memory still is), and sampling stops
        only when neither can be read."""
        import pynvml

        util = used = None
        if self._util_ok:
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0
            except pynvml.NVMLError as exc:
                self._util_ok, self.util_why = False, f"NVML refuses this GPU's utilisation ({exc})"
        if self._memory_ok:
            try:
                used = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)
            except pynvml.NVMLError:
                self._memory_ok = False
        if self._own_ok:
            own = self._own_bytes(pynvml)
            if own is not None:
                self.peak_own = max(self.peak_own or 0, own)
        if util is not None:
            self.samples.append((time.perf_counter(), util))
        if used is not None:
            self.peak_used = max(self.peak_used or 0, used)
        return self._util_ok or self._memory_ok

    def _own_bytes(self, pynvml: Any) -> int | None:
        try:
            return process_device_bytes(self._handle, self._pid, reserved_bytes(self._device_index))
        except pynvml.NVMLError:
            self._own_ok = False
            return None


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def children_cpu(proc: psutil.Process) -> dict[int, float]:
    """CPU seconds of each descendant (the loader workers), by pid; listed through /proc
    (:func:`descendants`), not psutil's scan of every process."""
    out: dict[int, float] = {}
    for pid in descendants(proc.pid):
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:  # exited between listing and reading
            continue
        out[pid] = t.user + t.system
    return out


class WindowMonitors:
    """The samplers a measured window runs beside the loop: the process tree's PSS
    (:class:`HostMemory`, every ``memory_interval`` seconds) and NVML (:class:`GpuUtil`);
    their start-up before the window's clock, their readings into the window after it."""

    def __init__(self, device: Any, memory_interval: float, reset_peaks: bool) -> None:
        self.device, self.cuda = device, device is not None and device.type == "cuda"
        self.memory = HostMemory(memory_interval).start()
        self.gpu = GpuUtil(device.index if self.cuda else None).start()
        if self.cuda and reset_peaks:
            import torch

            torch.cuda.reset_peak_memory_stats(device)

    def stop(self, window: Any, start: float) -> None:
        """Stop both; ``window`` gets the host peak, NVML's utilisation over ``[start, start
        + window.wall_s]`` and peaks, and the allocator's peak on CUDA."""
        window.peak_host_bytes = self.memory.stop()
        self.gpu.stop()
        window.gpu_util = self.gpu.mean(start, start + window.wall_s)
        window.gpu_util_why = self.gpu.util_why if window.gpu_util is None else None
        window.gpu_mem_used_bytes, window.gpu_mem_process_bytes = self.gpu.peak_used, self.gpu.peak_own
        if self.cuda:
            import torch

            window.peak_device_bytes = torch.cuda.max_memory_reserved(self.device)  # host-side counters
            window.peak_allocated_bytes = torch.cuda.max_memory_allocated(self.device)
