"""FLOPs: counted once per model, and the peak a device could do, for MFU.

MFU = achieved FLOP/s per device / the device's dense peak for the dtype the matmuls run
in. The peaks are the vendors' dense (no sparsity) tensor-core figures; fp32 matmuls use
the plain FP32 peak unless TF32 is allowed (PyTorch's default for matmuls is off since
1.12). A device not in the table gets no MFU, only achieved FLOP/s: a guessed peak would
make a number that looks exact and is not.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

TFLOPS = 1e12

# name fragment (matched in order, first hit wins) -> dense peak TFLOP/s by dtype
PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("GH200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("T4", {"fp16": 65.0, "fp32": 8.1}),
)
"""Sources: NVIDIA data sheets (H100/H200 SXM, H100 PCIe, A100, L40S, L4, A10, A10G, V100,
T4), dense figures. Extend here; nothing else needs to change."""


def peak_flops(device: torch.device, amp_dtype: str) -> float | None:
    """Dense peak FLOP/s of ``device`` for matmuls in ``amp_dtype``; ``None`` when unknown
    (every CPU, a GPU not in :data:`PEAKS`, a dtype the device has no tensor cores for)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return peak_for_name(name, amp_dtype, torch.backends.cuda.matmul.allow_tf32)


def peak_for_name(name: str, amp_dtype: str, allow_tf32: bool = False) -> float | None:
    """The table lookup behind :func:`peak_flops`, by the name CUDA reports."""
    key = "tf32" if amp_dtype == "fp32" and allow_tf32 else amp_dtype
    for fragment, peaks in PEAKS:
        if fragment in name:
            value = peaks.get(key)
            return value * TFLOPS if value is not None else None
    return None


def count_flops(step: Callable[[], Any]) -> float:
    """FLOPs ``step()`` performs (forward and backward both, when it runs both), counted
    by PyTorch's FlopCounterMode from the operators it dispatches (matmuls, convolutions,
    attention: what MFU is about; elementwise work counts as zero)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops())


_HOST_MATMUL: float | None = None


def host_matmul_flops() -> float:
    """FLOP/s this process's CPU threads reach on a large fp32 matmul, measured once per
    process (best of 5, ~50 ms): not a peak for MFU, a yardstick for the diagnosis, which
    calls a CPU step host-bound when it gets a tiny fraction of this."""
    global _HOST_MATMUL
    if _HOST_MATMUL is None:
        import time

        n = 1024
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # first call: thread pool start-up
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        _HOST_MATMUL = 2 * n**3 / best
    return _HOST_MATMUL
