"""Workers sharing a GPU node get disjoint GPUs (the lock files' arithmetic, without GPUs:
the entries are ``CUDA_VISIBLE_DEVICES`` names, and nothing here reads a device)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tuner.inputs.errors import RecipeError
from tuner.inputs.gpus import default_nproc, visible
from tuner.scriptmode.gpus import Claim


def test_workers_on_one_node_claim_disjoint_gpus_until_none_are_left(tmp_path):
    node = ["0", "1", "2", "3"]
    first, second = Claim(node, 2, tmp_path), Claim(node, 2, tmp_path)
    assert first.devices == ["0", "1"] and second.devices == ["2", "3"]
    assert second.env() == {"CUDA_VISIBLE_DEVICES": "2,3"}
    with pytest.raises(RecipeError, match=r"2 GPUs needed, but 4 of this node's 4 visible GPUs are held") as info:
        Claim(node, 2, tmp_path)
    assert "\n" not in str(info.value)
    first.release()
    assert Claim(node, 2, tmp_path).devices == ["0", "1"]  # a finished worker's GPUs are free again


def test_a_killed_workers_gpus_are_free_at_once(tmp_path):
    """The kernel drops a dead process's locks: no stale claim outlives a SIGKILL."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from tuner.scriptmode.gpus import Claim; "
        f"c = Claim(['0', '1'], 2, Path({str(tmp_path)!r})); print('held', flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RecipeError):
            Claim(["0", "1"], 1, tmp_path)
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            assert Claim(["0", "1"], 2, tmp_path).devices == ["0", "1"]
            break
        except RecipeError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_the_visible_gpus_are_cuda_visible_devices_own_entries(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, GPU-8f0e, 5")
    assert visible() == ["2", "GPU-8f0e", "5"] and default_nproc() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible() == [] and default_nproc() == 1  # no GPU: one rank, as before


def test_memory_that_stays_taken_is_waited_for_once_then_counted_as_taken(tmp_path):
    """Before each script trial the claimed GPUs' memory must be back to what it was before
    the first; memory that stays (another job, or the calling process itself, as in a lent
    H200's acceptance) is said once, after the wait, and later trials do not wait for it
    again. NVML is an autospec of the real pynvml (no GPU here): its used memory is 10 GiB
    at the claim and 11 GiB from then on."""
    from unittest import mock

    import pynvml

    from tuner.scriptmode import gpus

    nvml = mock.create_autospec(pynvml, instance=False)
    nvml.nvmlDeviceGetHandleByIndex.return_value = "handle"
    used = [10 * 2**30]
    nvml.nvmlDeviceGetMemoryInfo.side_effect = lambda handle: mock.Mock(used=used[0])
    with mock.patch.dict("sys.modules", {"pynvml": nvml}):
        claim = Claim(["0"], 1, tmp_path)
        assert claim.wait_free(wait_s=0.2) is None  # nothing held: no wait
        used[0] = 11 * 2**30
        start = time.monotonic()
        said = claim.wait_free(wait_s=0.3)
        assert said is not None and "GPU 0 1.0 GiB above" in said and time.monotonic() - start >= 0.3
        start = time.monotonic()
        assert claim.wait_free(wait_s=5.0) is None and time.monotonic() - start < 1.0
        used[0] = 12 * 2**30  # more taken after that: waited for again
        assert claim.wait_free(wait_s=0.2) is not None
    nvml.nvmlDeviceGetHandleByIndex.assert_called_with(0)
    assert gpus.FREE_SLACK_BYTES < 2**30
    claim.release()


def test_memory_the_calling_process_holds_itself_is_never_waited_for(tmp_path):
    """A caller that uses CUDA itself (a notebook; the GPU acceptance, whose in-process checks
    grew its cache by 0.9 GiB after the claim, and the launcher waited its 60 s for it): NVML's
    list of compute processes gives this process's own memory, which is taken off the GPU's
    used memory, so only another process's leftover is waited for. NVML is an autospec of
    the real pynvml; this process holds a CUDA context (``torch.cuda.is_initialized``)."""
    import os
    from unittest import mock

    import pynvml
    import torch

    nvml = mock.create_autospec(pynvml, instance=False)
    nvml.nvmlDeviceGetHandleByIndex.return_value = "handle"
    used, mine, other = [10 * 2**30], [2 * 2**30], [0]
    nvml.nvmlDeviceGetMemoryInfo.side_effect = lambda handle: mock.Mock(used=used[0])
    nvml.nvmlDeviceGetComputeRunningProcesses.side_effect = lambda handle: [
        mock.Mock(pid=os.getpid(), usedGpuMemory=mine[0]), mock.Mock(pid=1, usedGpuMemory=other[0])]
    with mock.patch.dict("sys.modules", {"pynvml": nvml}), \
            mock.patch.object(torch.cuda, "is_initialized", autospec=True, return_value=True):
        claim = Claim(["0"], 1, tmp_path)
        assert claim.baseline == {"0": 8 * 2**30}  # the GPU's 10 GiB less this process's 2
        used[0], mine[0] = 11 * 2**30, 3 * 2**30  # this process grew by 1 GiB
        start = time.monotonic()
        assert claim.wait_free(wait_s=5.0) is None and time.monotonic() - start < 1.0
        used[0], other[0] = 12 * 2**30, 2**30  # another process's GiB: waited for
        said = claim.wait_free(wait_s=0.3)
        assert said is not None and "GPU 0 1.0 GiB above" in said
    nvml.nvmlDeviceGetComputeRunningProcesses.assert_called_with("handle")
    claim.release()
    with mock.patch.dict("sys.modules", {"pynvml": nvml}):  # no CUDA context here: nothing taken off
        assert Claim(["0"], 1, tmp_path).baseline == {"0": 12 * 2**30}
