"""The lines that differ on a node of several GPUs, a partial node or a MIG slice, rehearsed
on this CPU against autospecs of the real ``pynvml`` and ``torch.cuda`` (:mod:`gpu_node`):
NVML matched by UUID, a MIG instance's utilisation said missing, one rank per GPU under NCCL,
the budget the least over the ranks, and the per-backend rule for ``comm_share``."""

from __future__ import annotations

import time

import pytest
import torch
from gpu_node import node, patched

from tuner.harness import distributed
from tuner.harness.comm import on_device
from tuner.harness.metrics import Window, unmeasured
from tuner.harness.system import devices
from tuner.harness.system.monitors import GpuUtil
from tuner.harness.system.nvml import nvml_handle
from tuner.inputs.errors import RecipeError


def test_a_cuda_device_is_nvmls_gpu_of_the_same_uuid_not_of_the_same_index():
    nvml, cuda = node(8, visible=(6, 7))
    with patched(nvml, cuda):
        assert nvml_handle(0) == "h6" and nvml_handle(1) == "h7"
    nvml.nvmlDeviceGetHandleByIndex.assert_not_called()


def test_a_mig_instance_gives_its_memory_and_says_in_one_line_it_has_no_utilisation():
    mig = "MIG-0000abcd-1111-2222-3333-444455556666"
    nvml, cuda = node(1, mig={0: mig})
    with patched(nvml, cuda):
        gpu = GpuUtil(0, interval=0.005).start()
        deadline = time.monotonic() + 5
        while gpu.peak_used is None and time.monotonic() < deadline:
            time.sleep(0.01)
        gpu.stop()
    assert gpu.peak_used == 2**30 and gpu.samples == []
    nvml.nvmlDeviceGetUtilizationRates.assert_not_called()
    window = Window(step_times=[0.1], samples=[8], data_waits=[0.0], wall_s=0.1, cpu_s=0.1,
                    gpu_util_why=gpu.util_why, energy_j=1.0, energy_key=mig)
    assert unmeasured([window]) == {"gpu_util": "a MIG instance has no utilisation of its own in NVML"}


@pytest.mark.parametrize(("local_rank", "ranks", "gpus"), [(0, 8, 8), (7, 8, 8), (1, 2, 8)])
def test_each_rank_has_its_own_gpu(monkeypatch, local_rank, ranks, gpus):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    assert distributed.device_index(local_rank, gpus) == local_rank


@pytest.mark.parametrize("local_rank", [0, 3])
def test_more_ranks_than_gpus_is_refused_under_nccl_on_every_rank_of_the_node(monkeypatch, local_rank):
    """Rank 0 too, though its own GPU exists: every rank refuses, so rank 0 says it."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.delenv(distributed.BACKEND_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(RecipeError, match=r"^nproc_per_node: 4 ranks on this node, and it has 2 GPU\(s\) this job "
                                          r"may use \(CUDA_VISIBLE_DEVICES=0,1\); NCCL takes one rank per GPU: "
                                          r"run --nproc_per_node=2 or fewer$"):
        distributed.device_index(local_rank, 2)


def test_ranks_fold_onto_the_gpus_over_gloo_said_once_on_the_node(monkeypatch, capsys):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv(distributed.BACKEND_ENV, "gloo")
    assert [distributed.device_index(r, 1) for r in (0, 1)] == [0, 0]
    said = capsys.readouterr().err.splitlines()
    assert said == ["tuner: 2 ranks share 1 GPU(s) on this node over gloo: each GPU's figures (memory, "
                    "utilisation, energy) are its ranks' together"]


def test_the_budget_is_the_least_room_over_the_ranks(monkeypatch):
    """``tuner plan`` and the search: a node where another job holds most of one GPU."""
    monkeypatch.setattr(devices, "room", lambda device=None: 70 * 2**30)
    monkeypatch.setattr(distributed, "all_gather", lambda obj: [obj, 12 * 2**30, obj])
    assert devices.least_room(torch.device("cuda", 0)) == 12 * 2**30


def test_comm_share_comes_from_the_trace_under_nccl_and_from_the_host_under_gloo(monkeypatch):
    """gloo stages CUDA tensors through the host: its collectives are the host's, and a trace
    of the device holds no communication kernel (it read about 0)."""
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    for backend, device, expected in [("nccl", "cuda", True), ("gloo", "cuda", False), ("gloo", "cpu", False)]:
        monkeypatch.setattr(dist, "get_backend", lambda group=None, b=backend: b)
        assert on_device(torch.device(device, 0) if device == "cuda" else torch.device(device)) is expected
    assert on_device(None) is False


def test_the_nvml_sampler_reads_the_gpu_of_its_uuid_on_a_partial_node():
    nvml, cuda = node(8, visible=(3,))
    with patched(nvml, cuda):
        gpu = GpuUtil(0)
    assert gpu._handle == "h3"


def test_rank_5_of_8_forms_an_nccl_group_bound_to_its_own_gpu(monkeypatch):
    """The NCCL lines of the group's start, run against the real ``init_process_group``'s
    signature: rank 5 of an 8-GPU node binds GPU 5 (``device_id``, NCCL's eager start), under
    torchrun's rendezvous."""
    import inspect
    from unittest import mock

    nvml, cuda = node(8)
    cuda.device_count.return_value = 8
    real = inspect.signature(torch.distributed.init_process_group)
    init = mock.Mock(side_effect=lambda *a, **k: real.bind(*a, **k))
    for var, value in {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv(distributed.BACKEND_ENV, raising=False)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", init)
    monkeypatch.setattr(distributed, "_at_exit", True)  # no exit hook for a group that is not there
    with patched(nvml, cuda):
        ctx = distributed.context()
    assert ctx.device == torch.device("cuda", 5) and ctx.rank == 5
    cuda.set_device.assert_called_once_with(torch.device("cuda", 5))
    kwargs = init.call_args.kwargs
    assert kwargs["backend"] == "nccl" and kwargs["device_id"] == torch.device("cuda", 5)
    assert "init_method" not in kwargs  # torchrun's env:// rendezvous, not a lone one
