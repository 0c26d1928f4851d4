"""Script mode on a GPU node: how many ranks a trial runs, which GPUs it gets, and whether
they are free when it starts.

The search's own process never trains in script mode, so it never creates a CUDA context
(that alone would hold a few hundred MiB of GPU 0 for the whole search): the GPUs are
counted and read through NVML.

- ``nproc_per_node`` defaults to the GPUs this process may use (``CUDA_VISIBLE_DEVICES``,
  else every GPU NVML lists), 1 without any.
- Workers sharing a node (several ``tuner.search`` processes on one study) must not measure
  on the same GPUs. Each claims ``nproc_per_node`` of the visible GPUs with one lock file
  per GPU (``flock``, held for the worker's life and dropped by the kernel when it dies,
  however it dies), and its trials see only those (``CUDA_VISIBLE_DEVICES``). A worker that
  finds too few free says so in one line.
- A killed trial's processes can hold their GPU memory for a moment after the tree is
  gone. Before each trial the claimed GPUs' used memory must be back to what it was before
  the first one; the launcher waits for that, and says so when it does not come.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner.inputs.errors import RecipeError
from tuner.inputs.gpus import used_bytes, visible

FREE_SLACK_BYTES = 512 * 2**20
"""Used memory may exceed what it was before the first trial by this much (the driver's own
bookkeeping moves by a few MiB) and still count as free."""
FREE_WAIT_S = 60.0
"""How long the launcher waits for a killed trial's memory to be given back."""


class Claim:
    """This worker's GPUs on the node: ``n`` of ``devices`` whose lock files it holds."""

    def __init__(self, devices: list[str], n: int, folder: Path | None = None) -> None:
        self.folder = folder or Path(tempfile.gettempdir()) / f"tuner-gpus-{os.getuid()}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._files: list[Any] = []
        self.devices: list[str] = []
        for entry in devices:
            if len(self.devices) == n:
                break
            f = (self.folder / f"{entry.replace('/', '_')}.lock").open("a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()}\n")
            f.flush()
            self._files.append(f)
            self.devices.append(entry)
        if len(self.devices) < n:
            held = len(devices) - len(self.devices)
            self.release()
            raise RecipeError(
                f"nproc_per_node: {n} GPUs needed, but {held} of this node's {len(devices)} visible GPUs are held "
                f"by other tuner workers ({self.folder}); give each worker on a node nproc_per_node <= "
                f"{len(devices) // 2 or 1}, or fewer workers")
        self.baseline = used_bytes(self.devices, _own_pids())
        """Each GPU's used memory before the first trial, less this process's own: what free
        looks like."""

    def release(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        self._files = []

    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices)}

    def wait_free(self, wait_s: float = FREE_WAIT_S) -> str | None:
        """Block until every claimed GPU's used memory is back to its baseline (a killed
        trial's memory given back); ``None`` when it is, else the one line saying where it
        is not, after ``wait_s``. What they hold then becomes the baseline, so memory another job
        keeps costs one wait, not one a trial. This process's own memory is not counted: a caller
        that uses CUDA itself is no trial's leftover.
        """
        deadline = time.monotonic() + wait_s
        while True:
            now = used_bytes(list(self.baseline), _own_pids())
            held = {e: u - self.baseline[e] for e, u in now.items() if u - self.baseline[e] > FREE_SLACK_BYTES}
            if not held:
                return None
            if time.monotonic() >= deadline:
                self.baseline.update(now)
                said = ", ".join(f"GPU {e} {b / 2**30:.1f} GiB" for e, b in held.items())
                return (f"the GPUs still hold memory {wait_s:.0f} s after the last trial ended ({said} above what "
                        "they held before the first trial): a process of that trial may still be alive, or "
                        "another job is using them; this trial's memory and speed may be off (later trials "
                        "count this memory as taken and do not wait for it)")
            time.sleep(0.5)


def _own_pids() -> frozenset[int]:
    """This process's PIDs (in each PID namespace /proc shows) where it holds a CUDA context,
    else none: a search that never touched CUDA has nothing of its own on the GPUs."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return frozenset()
    from tuner.harness.system.nvml import namespace_pids

    return frozenset(namespace_pids(os.getpid()))


_CLAIM: Claim | None = None


def claim(n: int) -> Claim | None:
    """This worker's claim on ``n`` of the node's visible GPUs, made once per process;
    ``None`` without GPUs."""
    global _CLAIM
    devices = visible()
    if not devices:
        return None
    if _CLAIM is None or len(_CLAIM.devices) != n:
        if _CLAIM is not None:
            _CLAIM.release()
        _CLAIM = Claim(devices, n)
    return _CLAIM
