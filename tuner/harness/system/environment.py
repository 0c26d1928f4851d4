"""The environment recorded with every result, so two results can be compared or refused."""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

import torch

from tuner.harness.system.flops import host_matmul_flops
from tuner.inputs.gpus import nvml_text

SETTINGS_PREFIXES = ("NCCL_", "TORCH_NCCL_")
SETTINGS = ("CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
"""The process settings two GPU runs most often differ by (NCCL's algorithm, protocol and
channels, the allocator, the connections that overlap compute and communication): recorded
as set, every one, so ``tuner compare`` can name what differs."""


def environment(world_size: int) -> dict[str, Any]:
    """DESIGN.md's ``"environment"`` record, with what tells two GPU runs apart beside it:
    NCCL's version, the driver and the CUDA version it supports, each GPU's clocks and power
    limit as NVML reads them, and the NCCL / allocator settings (:data:`SETTINGS`)."""
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "deepspeed": _version("deepspeed"),
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu: {_cpu_model()}",
        "device_count": torch.cuda.device_count() if cuda else 1,
        "world_size": world_size,
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "host_matmul_tflops": round(host_matmul_flops() / 1e12, 4),
        "nccl": nccl_version() if cuda else None,
        **(gpu_record() if cuda else {"driver": None, "cuda_driver": None, "gpus": None}),
        "settings": settings(),
    }


def settings(env: Any = None) -> dict[str, str]:
    """Every ``NCCL_*`` / ``TORCH_NCCL_*`` variable and each of :data:`SETTINGS` that is set."""
    env = os.environ if env is None else env
    return {k: env[k] for k in sorted(env) if k.startswith(SETTINGS_PREFIXES) or k in SETTINGS}


def nccl_version() -> str | None:
    """The NCCL this PyTorch loads (``2.21.5``), or ``None`` (a build without it)."""
    try:
        found = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - no NCCL in this build
        return None
    return ".".join(map(str, found)) if isinstance(found, tuple) else str(found)


def gpu_record() -> dict[str, Any]:
    """NVML's view: the driver, the CUDA version it supports, and per GPU of the node, in
    NVML's order (a description of the node, matched to no rank), its SM clock now and at
    most, its memory clock, and the power limit it enforces (a capped or down-clocked GPU is
    the commonest reason one node is slower than its twin)."""
    out: dict[str, Any] = {"driver": None, "cuda_driver": None, "gpus": None}
    try:
        import pynvml

        pynvml.nvmlInit()
        out["driver"] = nvml_text(pynvml.nvmlSystemGetDriverVersion())
        version = pynvml.nvmlSystemGetCudaDriverVersion()
        out["cuda_driver"] = f"{version // 1000}.{version % 1000 // 10}"
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append({"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                         "sm_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                         "mem_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                         "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0})
        out["gpus"] = gpus
    except Exception:  # noqa: BLE001 - no NVML, or it refused one reading: what was read stays
        pass
    return out


def _version(dist_name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    """CPUs this process may run on (its affinity, as taskset or a Slurm allocation sets it)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else (os.cpu_count() or 1)


def rank_threads(world_size: int) -> dict[str, int]:
    """The intra-op threads this rank's step runs on (``step``) and the cores each rank on
    this node has (``cores_per_rank``: this process's affinity shared by the node's ranks,
    torchrun's ``LOCAL_WORLD_SIZE``), counted in physical cores as torch's own default count
    is (a second hardware thread of a core adds little to a matmul). torchrun starts every
    rank of a multi-process job on ``OMP_NUM_THREADS=1``: a 2-rank CPU job on a 16-core host
    steps on 2 of its cores. Under a launcher that binds each rank to its own cores this
    undercounts, so the advice it feeds (more threads) errs towards silence."""
    import psutil

    logical = os.cpu_count() or 1
    physical = min(logical, psutil.cpu_count(logical=False) or logical)
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or 1))
    return {"step": torch.get_num_threads(), "cores_per_rank": max(1, cores() * physical // logical // ranks)}
