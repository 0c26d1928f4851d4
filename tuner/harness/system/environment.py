"""The environment recorded with every result, so two results can be compared or refused."""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

import torch

from tuner.harness.system.flops import host_matmul_flops


def environment(world_size: int) -> dict[str, Any]:
    """DESIGN.md's ``"environment"`` record."""
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
    }


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
