"""The environment two GPU runs are told apart by: NCCL's version, the driver and its CUDA,
each GPU's clocks and power limit, the NCCL and allocator settings; ``tuner compare``
names what differs. The CUDA and NVML lines run against autospecs of the real ``torch.cuda``
and ``pynvml`` (a misspelled name fails here); nothing read under them is a measurement."""

from __future__ import annotations

from unittest import mock

import pynvml
import torch

from tuner.analysis.run_verdicts import environment_notes
from tuner.harness.system import environment as env_mod
from tuner.outputs import wording


def _nvml() -> mock.MagicMock:
    nvml = mock.create_autospec(pynvml, instance=False)
    nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    nvml.nvmlSystemGetDriverVersion.return_value = "570.124.06"
    nvml.nvmlSystemGetCudaDriverVersion.return_value = 12080
    nvml.nvmlDeviceGetCount.return_value = 2
    nvml.nvmlDeviceGetHandleByIndex.side_effect = lambda i: f"gpu{i}"
    clocks = {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}
    nvml.nvmlDeviceGetClockInfo.side_effect = lambda h, kind: clocks[kind]
    nvml.nvmlDeviceGetMaxClockInfo.return_value = 1980
    nvml.nvmlDeviceGetEnforcedPowerLimit.side_effect = lambda h: 700_000 if h == "gpu0" else 500_000
    return nvml


def test_a_gpu_environment_records_nccl_the_driver_clocks_and_power_limits(monkeypatch):
    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value = True
    cuda.get_device_name.return_value = "NVIDIA H100 80GB HBM3"
    cuda.device_count.return_value = 2
    cuda.nccl.version.return_value = (2, 21, 5)
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with mock.patch.object(torch, "cuda", cuda), mock.patch.dict("sys.modules", {"pynvml": _nvml()}):
        record = env_mod.environment(world_size=2)
    assert record["nccl"] == "2.21.5" and record["driver"] == "570.124.06" and record["cuda_driver"] == "12.8"
    assert record["gpus"] == [{"sm_mhz": 1980, "sm_max_mhz": 1980, "mem_mhz": 2619, "power_limit_w": 700.0},
                              {"sm_mhz": 1980, "sm_max_mhz": 1980, "mem_mhz": 2619, "power_limit_w": 500.0}]
    assert record["settings"]["NCCL_ALGO"] == "Ring"
    assert record["settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert record["device"] == "NVIDIA H100 80GB HBM3" and record["device_count"] == 2


def test_a_cpu_environment_has_no_gpu_fields_made_up():
    record = env_mod.environment(world_size=1)
    if not torch.cuda.is_available():
        assert record["nccl"] is None and record["driver"] is None and record["gpus"] is None
    assert isinstance(record["settings"], dict)


def test_settings_are_the_nccl_and_allocator_variables_only():
    got = env_mod.settings({"NCCL_IB_DISABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "HOME": "/root",
                            "CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCLX": "no"})
    assert got == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_IB_DISABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_compare_names_what_differs_between_two_gpu_runs():
    a = {"device": "H100", "nccl": "2.21.5", "driver": "570.124.06", "settings": {"NCCL_ALGO": "Ring"},
         "gpus": [{"sm_mhz": 1980, "power_limit_w": 700.0}]}
    b = {"device": "H100", "nccl": "2.23.4", "driver": "570.124.06", "settings": {"NCCL_PROTO": "Simple"},
         "gpus": [{"sm_mhz": 1980, "power_limit_w": 500.0}]}
    found = environment_notes(a, b)
    assert [d.key for d in found] == ["nccl", "gpus", "NCCL_ALGO", "NCCL_PROTO"]  # the same driver: not named
    notes = [wording.difference(d) for d in found]
    assert "NCCL: A '2.21.5', B '2.23.4'" in notes
    assert "NCCL_ALGO: A 'Ring', B unset" in notes and "NCCL_PROTO: A unset, B 'Simple'" in notes
    assert any(n.startswith("GPU clocks and power limits") for n in notes)
    assert environment_notes({"device": "cpu"}, {"device": "cpu"}) == []  # records from before: nothing invented
