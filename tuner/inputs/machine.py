"""What this machine can do, as far as the levers care (read once, before a search)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Machine:
    """What this machine can do, as far as the knobs care."""

    cuda: bool
    bf16: bool
    fp16: bool
    compiler: bool = True
    """What ``torch.compile``'s inductor needs here: a C++ compiler for CPU code; on CUDA,
    triton and a C compiler (triton builds its kernel launchers with the system's ``cc``)."""
    compiler_missing: str = ""
    """What of that is missing, in words (empty when nothing is)."""
    fsdp2: bool = True
    cudnn: bool = False
    """cuDNN on a CUDA device (``cudnn_benchmark`` picks its convolution algorithms)."""
    in_order: bool = True
    """This PyTorch's DataLoader takes ``in_order`` (torch >= 2.6)."""
    capability: tuple[int, int] | None = None
    """The CUDA device's compute capability (9, 0 for Hopper); ``None`` without CUDA."""
    packages: frozenset[str] = frozenset()
    """Optional kernel libraries installed here (``torchao``, ``liger_kernel``)."""

    @classmethod
    def detect(cls) -> "Machine":
        import inspect

        import torch

        cuda = torch.cuda.is_available()
        # bf16 autocast runs on every CPU torch supports; on CUDA only where the device runs it
        # natively (Ampere or newer): by default torch also says yes where it is emulated, and
        # an emulated bf16 trial on a V100 or T4 is slower and measures nothing a user wants.
        bf16 = native_bf16(torch) if cuda else True
        missing = compiler_missing(cuda)
        # FSDP2's fully_shard is public from torch 2.6; importing it to find out cost 0.3-0.7 s
        # of every search's start (torch.distributed.fsdp loads its whole package).
        fsdp2 = torch.distributed.is_available() and torch.__version__ >= (2, 6)
        cudnn = cuda and torch.backends.cudnn.is_available()
        in_order = "in_order" in inspect.signature(torch.utils.data.DataLoader).parameters
        capability = tuple(torch.cuda.get_device_capability()) if cuda else None
        return cls(cuda=cuda, bf16=bf16, fp16=cuda, compiler=not missing, compiler_missing=missing, fsdp2=fsdp2,
                   cudnn=cudnn, in_order=in_order, capability=capability,  # type: ignore[arg-type]
                   packages=installed(("torchao", "liger_kernel")))


def installed(names: tuple[str, ...]) -> frozenset[str]:
    """Which of the optional packages ``names`` are installed (found, not imported)."""
    import importlib.util

    return frozenset(n for n in names if importlib.util.find_spec(n) is not None)


def compiler_missing(cuda: bool) -> str:
    """What inductor lacks on this machine: on a CPU a C++ compiler; on CUDA triton and a C
    compiler (seen on a CUDA image without gcc: every compiled trial failed in triton's
    launcher build, each recorded an error, where the lever should have left the space)."""
    import importlib.util
    import os
    import shutil

    if not cuda:
        found = any(shutil.which(c) for c in ("g++", "c++", "clang++"))
        return "" if found else "a C++ compiler on the PATH (g++ or clang++) for CPU code"
    missing = []
    if importlib.util.find_spec("triton") is None:
        missing.append("triton (pip install triton)")
    if not any(shutil.which(c) for c in (os.environ.get("CC", ""), "cc", "gcc", "clang") if c):
        missing.append("a C compiler on the PATH (cc, gcc or clang) for triton's kernel launchers")
    return " and ".join(missing)


def native_bf16(torch: Any) -> bool:
    """Whether the current CUDA device runs bf16 natively, not emulated."""
    import inspect

    check = torch.cuda.is_bf16_supported
    if "including_emulation" in inspect.signature(check).parameters:
        return bool(check(including_emulation=False))
    return bool(check())
