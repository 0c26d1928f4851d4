"""Background samplers that watch a trial without touching its loop.

:class:`HostMemory` samples the proportional set size (PSS) of this process and all its
descendants (DataLoader workers). PSS splits each shared page among the processes that
map it, so forked workers that share the parent's pages are not counted once per worker
the way summed RSS would count them.
"""

from __future__ import annotations

import threading

import psutil


def tree_pss_bytes(root: psutil.Process) -> int:
    """PSS of ``root`` and its descendants, in bytes (RSS where PSS is unavailable)."""
    total = 0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except psutil.Error:  # a worker that exited between listing and reading
            continue
    return total


class HostMemory:
    """Peak PSS of the process tree, sampled every ``interval`` seconds in a thread.

    Reading ``/proc/<pid>/smaps_rollup`` costs about a millisecond per process, so the
    default 10 Hz costs the trial well under 1% of one core.
    """

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.peak = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int:
        """Take one sample now (also called at phase boundaries so short trials are seen)."""
        value = tree_pss_bytes(self._proc)
        self.peak = max(self.peak, value)
        return value

    def start(self) -> "HostMemory":
        self.peak = 0
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="tuner-host-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop sampling and return the peak in bytes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()
        return self.peak

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
