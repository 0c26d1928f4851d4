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

PEAKS: tuple[tuple[frozenset[str], frozenset[str], dict[str, float], int], ...] = (
    # (tokens the name must hold, tokens it must not, dense peak TFLOP/s by dtype, the whole GPU's SMs)
    (frozenset({"GB300"}), frozenset(), {"bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0}, 160),
    (frozenset({"B300"}), frozenset({"GB300"}), {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0}, 160),
    (frozenset({"GB200"}), frozenset(), {"bf16": 2500.0, "fp16": 2500.0, "tf32": 1250.0, "fp32": 80.0,
                                         "fp8": 5000.0}, 148),
    (frozenset({"B200"}), frozenset({"GB200"}), {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0,
                                                 "fp8": 4500.0}, 148),
    (frozenset({"H200", "NVL"}), frozenset(), {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0,
                                               "fp8": 1670.5}, 132),
    (frozenset({"H200"}), frozenset({"NVL"}), {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9,
                                               "fp8": 1978.9}, 132),
    (frozenset({"H100", "NVL"}), frozenset(), {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0,
                                               "fp8": 1670.5}, 132),
    (frozenset({"H100", "PCIE"}), frozenset(), {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2,
                                                "fp8": 1513.0}, 114),
    (frozenset({"H100"}), frozenset({"NVL", "PCIE"}), {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9,
                                                       "fp8": 1978.9}, 132),
    (frozenset({"GH200"}), frozenset(), {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9},
     132),
    (frozenset({"A100"}), frozenset(), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}, 108),
    (frozenset({"L40S"}), frozenset(), {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6, "fp8": 733.0},
     142),
    (frozenset({"L40"}), frozenset(), {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5, "fp8": 362.0}, 142),
    (frozenset({"L4"}), frozenset(), {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3, "fp8": 242.5}, 58),
    (frozenset({"A10G"}), frozenset(), {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}, 80),
    (frozenset({"A10"}), frozenset(), {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}, 72),
    (frozenset({"V100"}), frozenset(), {"fp16": 125.0, "fp32": 15.7}, 80),
    (frozenset({"T4"}), frozenset(), {"fp16": 65.0, "fp32": 8.1}, 40),
)
"""Sources: NVIDIA data sheets (H100/H200 SXM and NVL, H100 PCIe, GH200, A100, L40S, L40,
L4, A10, A10G, V100, T4; HGX B200 and HGX B300 per GPU, GB200 NVL72 and GB300 NVL72 per
GPU), dense figures (half the sparsity ones), and each whole GPU's streaming
multiprocessors. ``fp8`` is the FP8 tensor-core peak, what an FP8-training trial's MFU is
against; a part without FP8 tensor cores has none, and such a trial gets no MFU. Blackwell
Ultra (B300, GB300) raised FP4, not FP8 or BF16; its TF32 and FP32 are left out (not in its
data sheets' dense form). A name is matched by whole tokens (split at spaces and hyphens),
never by substring: ``NVIDIA L40`` holds the text "L4", ``NVIDIA H100 NVL`` is not the SXM,
``NVIDIA GB200`` is not a B200. A MIG slice (``NVIDIA A100-SXM4-40GB MIG 3g.20gb``: 42 of
the A100's 108 SMs) has its share of the peak, by its SMs. Extend here; nothing else needs
to change."""


def peak_flops(device: torch.device, amp_dtype: str, convolutions: bool = False) -> float | None:
    """Dense peak FLOP/s of ``device`` for matmuls in ``amp_dtype``; ``None`` when unknown
    (every CPU, a GPU not in :data:`PEAKS`, a dtype the device has no tensor cores for).
    ``convolutions``: the model has convolutions, which cuDNN runs in TF32 by default."""
    if device.type != "cuda":
        return None
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return peak_for_name(torch.cuda.get_device_name(device), amp_dtype, tf32_in_use(convolutions), sms)


def holds_convolutions(module: torch.nn.Module) -> bool:
    """Whether ``module`` has a convolution (channels_last and cuDNN's algorithm search act on
    nothing else; a script's BERT was advised channels_last)."""
    conv = torch.nn.modules.conv._ConvNd  # noqa: SLF001 - the private base of every convolution class
    return any(isinstance(m, conv) for m in module.modules())


def trains_convolutions(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a convolution's parameters are among those ``optimizer`` trains: what a script
    adapter that sees optimizers, not modules (``adapt: torch``, ``adapt: lightning``), can
    know of the model. One pass over the live objects at the first step, outside the window
    (a script's ViT under ``adapt: torch`` was otherwise advised channels_last)."""
    import gc

    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    conv = torch.nn.modules.conv._ConvNd  # noqa: SLF001 - the private base of every convolution class
    # type(), not isinstance(): a dead weak proxy raises on __class__
    return any(issubclass(type(obj), conv) and any(id(p) in params for p in obj.parameters(recurse=False))
               for obj in gc.get_objects())


class AttentionCalls:
    """Whether a script's model calls ``scaled_dot_product_attention`` (directly, or through
    ``nn.MultiheadAttention``, whose training path calls it by its module-level name): what an
    attention-kernel lever acts on. For adapters that see optimizers, not a forward they run
    (``adapt: torch``, ``adapt: lightning``); a task trial reads it off its FLOP count. timm's
    mobilenetv3 under ``adapt: torch`` was advised the flash attention kernel.

    :meth:`start` puts a counting wrapper in ``torch.nn.functional``'s place before the
    script's first forward; :meth:`stop` (at its first optimizer step, outside the window)
    puts the original back. The wrapper stays correct where the model kept a reference to it."""

    def __init__(self) -> None:
        self.seen = False
        self._original: Callable[..., Any] | None = None
        self._wrapper: Callable[..., Any] | None = None
        self._graphs = 0

    def start(self) -> None:
        import functools

        import torch.nn.functional as F

        original = F.scaled_dot_product_attention

        @functools.wraps(original)
        def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
            self.seen = True
            return original(*args, **kwargs)

        self._original, self._wrapper = original, scaled_dot_product_attention
        self._graphs = _graphs_compiled()
        F.scaled_dot_product_attention = scaled_dot_product_attention

    def stop(self) -> bool | None:
        """Whether the model called it (``None``: unknown, where torch.compile compiled
        graphs while it watched: they call the original they captured, not the wrapper)."""
        import torch.nn.functional as F

        if self._wrapper is not None and F.scaled_dot_product_attention is self._wrapper:
            F.scaled_dot_product_attention = self._original
        self._wrapper = None
        if self.seen:
            return True
        return None if _graphs_compiled() > self._graphs else False


def _graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process so far (0 where dynamo was never
    imported: nothing compiled, and nothing imported to find out)."""
    import sys

    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0


def tf32_in_use(convolutions: bool) -> bool:
    """Whether fp32 work runs on TF32 tensor cores: matmuls when PyTorch allows it
    (``set_float32_matmul_precision("high")``; off by default), convolutions when cuDNN does
    (on by default). Then the fp32 peak is TF32's: against plain FP32's an fp32 ResNet on an
    A100 would read an MFU above 1."""
    backends = torch.backends
    return bool(backends.cuda.matmul.allow_tf32 or (convolutions and backends.cudnn.allow_tf32))


def peak_for_name(name: str, amp_dtype: str, allow_tf32: bool = False, sms: int | None = None) -> float | None:
    """The table lookup behind :func:`peak_flops`, by the name CUDA reports; ``sms``: the
    device's streaming multiprocessors, which scale the peak of a slice (a MIG instance;
    one named MIG without them has no known peak)."""
    key = "tf32" if amp_dtype == "fp32" and allow_tf32 else amp_dtype
    tokens = set(name.upper().replace("-", " ").split())
    for required, excluded, peaks, whole in PEAKS:
        if required <= tokens and not excluded & tokens:
            value = peaks.get(key)
            if value is None or ("MIG" in tokens and sms is None):
                return None
            return value * TFLOPS * (min(sms, whole) / whole if sms else 1.0)
    return None


def count_flops(step: Callable[[], Any], ops: set[str] | None = None) -> float:
    """FLOPs ``step()`` performs (forward and backward both, when it runs both), counted
    by PyTorch's FlopCounterMode from the operators it dispatches (matmuls, convolutions,
    attention: what MFU is about; elementwise work counts as zero). ``ops`` receives the
    names of the counted operators (``aten.convolution``, ``aten._scaled_dot_product_...``):
    what the model is made of, for advice that only some models can take."""
    from torch.utils.flop_counter import FlopCounterMode

    _count_cpu_attention()
    counter = FlopCounterMode(display=False)
    calls = _Calls()
    with counter, calls:
        step()
    if ops is not None:
        ops.update(str(op) for op in counter.get_flop_counts().get("Global", {}))
        ops.update(calls.names)
    return float(counter.get_total_flops())


class _Calls(torch.overrides.TorchFunctionMode):
    """The names of the torch functions a step's Python code calls (the outermost: inside
    a call the mode is off): on the meta device ``scaled_dot_product_attention``
    dispatches to its math path (``aten.bmm``), so the counted operators alone do not show
    that the model calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def uses_attention(ops: set[str]) -> bool:
    """Whether a counted step (:func:`count_flops`) called scaled_dot_product_attention
    (directly, or through ``nn.MultiheadAttention``, which calls it when no attention
    weights are asked for): what an attention-kernel lever acts on."""
    return any("scaled_dot_product" in op or op == "multi_head_attention_forward" for op in ops)


_CPU_ATTENTION = False


def _count_cpu_attention() -> None:
    """FlopCounterMode (torch 2.13) has formulas for the CUDA attention kernels, none for the
    CPU's fused one (``_scaled_dot_product_flash_attention_for_cpu``): a CPU count of a
    model whose attention goes through ``scaled_dot_product_attention`` left it out (a 4 x
    256 x 512 encoder: 19.3 GFLOP a sample counted against 20.9 by hand). Counted here as
    the model's FLOPs, as the meta-device count gives them (the math path's matmuls: the
    scores and the weighted sum forward, twice that backward), not with a flash kernel's
    recompute of the scores (which the CUDA formulas include: 21.2)."""
    global _CPU_ATTENTION
    if _CPU_ATTENTION:
        return
    _CPU_ATTENTION = True
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is None or backward is None or forward in fc.flop_registry:
        return

    @fc.register_flop_formula(forward)
    def _forward(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    @fc.register_flop_formula(backward)
    def _backward(grad_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                  **kwargs: Any) -> int:
        return 2 * fc.sdpa_flop_count(query_shape, key_shape, value_shape)


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
