"""The GPUs a script trial is handed, named by NVML's UUIDs (a CUDA index is not an NVML
index), on a node of 8 GPUs rehearsed against autospecs of the real ``pynvml`` and
``torch.cuda`` (:mod:`gpu_node`)."""

from __future__ import annotations

import pytest
from gpu_node import node, patched, uuid

from tuner.inputs.errors import RecipeError
from tuner.inputs.gpus import default_nproc, handle, used_bytes, visible


def test_without_cuda_visible_devices_every_gpu_is_named_by_its_uuid(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml, cuda = node(8)
    with patched(nvml, cuda):
        assert visible() == [uuid(i) for i in range(8)] and default_nproc() == 8


def test_cuda_visible_devices_indices_become_the_uuids_of_those_gpus(monkeypatch):
    """2 of 8 GPUs: the trial gets the UUIDs, so the GPUs it trains on are the ones NVML reads."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    nvml, cuda = node(8)
    with patched(nvml, cuda):
        entries = visible()
        assert entries == [uuid(2), uuid(5)] and default_nproc() == 2
        assert list(used_bytes(entries)) == entries
    nvml.nvmlDeviceGetHandleByUUID.assert_any_call(uuid(5))


def test_on_a_node_of_mixed_gpus_an_index_is_refused_unless_the_order_is_the_pci_bus(monkeypatch):
    """CUDA numbers fastest first: with an A100 and an H100 its 0 may be NVML's 1."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    nvml, cuda = node(2, names=["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"])
    with patched(nvml, cuda), pytest.raises(RecipeError, match=r"^CUDA_VISIBLE_DEVICES=1 names GPUs by CUDA's "
                                                                r"index, .* set CUDA_DEVICE_ORDER=PCI_BUS_ID") as info:
        visible()
    assert "\n" not in str(info.value)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    with patched(nvml, cuda):
        assert visible() == [uuid(1)]


def test_a_mig_instance_is_read_by_its_own_handle(monkeypatch):
    mig = "MIG-0000abcd-1111-2222-3333-444455556666"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig)
    nvml, cuda = node(1, mig={0: mig})
    with patched(nvml, cuda):
        assert visible() == [mig] and handle(mig) == "mig0"
        assert used_bytes([mig]) == {mig: 2**30}  # the instance's own memory
