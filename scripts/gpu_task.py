"""The task ``scripts/gpu_acceptance.py`` measures (``task:`` in the recipes it writes).

Three models, by ``task_args["model"]``:

- ``mlp`` (default): IN -> WIDTH x DEPTH -> 16 classes, 210 M parameters at the default
  width, 512 samples a step: about 13 ms of fp32 matmuls on an H200 against a few ms of
  host time to collate, so the step is the device's unless a check makes the loader slow.
- ``transformer``: LAYERS pre-norm encoder blocks (attention through
  ``scaled_dot_product_attention``, MLP of 4 x d) on random tokens' embeddings: the FLOP
  count's truth for a model with attention (:func:`analytic_flops_per_sample`).
- ``matmul``: a bias-free stack of ``MATMUL_DEPTH`` ``MATMUL_WIDTH``-wide matmuls, nothing
  else: MFU's truth (every FLOP is a matmul the analytic count names; at 8192 wide, 12 deep
  and 1024 samples a step, about 4.9 TFLOP, milliseconds of bf16 on an H200). Its samples
  are indices into a frozen table on the device (no FLOPs, no gradient): on an H200 a
  sample of 8192 floats made the loader collate and copy 64 MiB a step, and the tuner's
  step (59 ms) was the loader's, not the matmuls' (a plain loop with the batch collated
  once: 19 ms), so the row compared two different jobs.

The loader can be made slow (``sleep_ms`` of host time per batch, in ``collate``), the
batch can carry a ``payload`` of floats per sample to copy to the device, and the forward
or backward can be made to run out of memory, to trip a device-side assert, to fail on
rank 1, or to be slow for micro-batches below ``slow_below`` (``slow_ms`` each: a
configuration the prune rule must cut). For the GPU levers' checks it records the SDPA
backends enabled where its attention runs (``sdpa_log``) and what its process says of the
CUDA allocator (``alloc_log``).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

WIDTH, DEPTH, IN, MICRO = 8192, 4, 1024, 512
SEQ, D_MODEL, HEADS, LAYERS = 256, 512, 8, 4
"""The transformer's sequence length, width, heads and blocks."""
MATMUL_WIDTH, MATMUL_DEPTH = 8192, 12
"""The matmul stack's width and depth: compute-bound in bf16 on a 2026 GPU."""


class Synthetic(torch.utils.data.Dataset):
    """Random samples (``IN`` features, ``SEQ`` x ``D_MODEL`` embeddings, or a row of the
    matmul stack's table; a class), an optional ``payload`` tensor of that many floats each."""

    def __init__(self, size: int, payload: int, model: str = "mlp") -> None:
        self.size, self.payload, self.model = size, payload, model
        g = torch.Generator().manual_seed(0)
        shape = (64, SEQ, D_MODEL) if model == "transformer" else (64, IN)
        self.x = torch.arange(64) if model == "matmul" else torch.randn(*shape, generator=g)
        self.y = torch.randint(0, 16, (64,), generator=g)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        j = i % 64
        if self.payload:
            return self.x[j], self.y[j], torch.zeros(self.payload)
        return self.x[j], self.y[j]


_ARGS: dict[str, Any] = {}


def build_dataset(args: dict[str, Any]) -> Synthetic:
    _ARGS.clear()
    _ARGS.update(args)
    model = args.get("model", "mlp")
    return Synthetic(args.get("size", 1 << 16), args.get("payload", 0), model)


def collate(samples: list[Any]) -> Any:
    if _ARGS.get("sleep_ms"):
        time.sleep(_ARGS["sleep_ms"] / 1000.0)
    return torch.utils.data.default_collate(samples)


class _BackwardOOM(torch.autograd.Function):
    """Identity forward; a backward that asks for more memory than the device has."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        total = torch.cuda.get_device_properties(grad.device).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=grad.device)
        return grad


_WRITTEN: set[tuple[str, ...]] = set()


def _record_sdpa(path: str) -> None:
    """The SDPA backends enabled where the attention runs (``sdpa_kernel`` leaves one), each
    new set once, to a file the acceptance check reads."""
    import json

    b = torch.backends.cuda
    enabled = tuple(n for n, on in (("math", b.math_sdp_enabled()), ("flash", b.flash_sdp_enabled()),
                                    ("efficient", b.mem_efficient_sdp_enabled()), ("cudnn", b.cudnn_sdp_enabled()))
                    if on)
    if enabled not in _WRITTEN:
        _WRITTEN.add(enabled)
        with open(path, "a") as f:
            f.write(json.dumps(enabled) + "\n")


def _record_allocator(path: str) -> None:
    """What the trial's process says of its CUDA allocator, once: the environment variable
    and whether its segments are expandable (the allocator's own snapshot)."""
    import json
    import os

    if os.path.exists(path):
        return
    segments = torch.cuda.memory_snapshot()
    with open(path, "w") as f:
        json.dump({"env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "segments": len(segments),
                   "expandable": sum(bool(s.get("is_expandable")) for s in segments)}, f)


class Block(nn.Module):
    """Pre-norm attention and MLP, the way GPT-2 and Llama compose them."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if _ARGS.get("sdpa_log") and x.is_cuda:  # not the FLOP count's meta-device pass
            _record_sdpa(_ARGS["sdpa_log"])
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(D_MODEL, HEADS) for _ in range(LAYERS))
        self.head = nn.Linear(D_MODEL, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


def build_model(args: dict[str, Any]) -> nn.Module:
    model = args.get("model", "mlp")
    if model == "transformer":
        return Transformer()
    if model == "matmul":
        d = args.get("width", MATMUL_WIDTH)
        table = nn.Embedding.from_pretrained(torch.randn(64, d, generator=torch.Generator().manual_seed(0)))
        return nn.Sequential(table, *(nn.Linear(d, d, bias=False) for _ in range(MATMUL_DEPTH)),
                             nn.Linear(d, 16, bias=False))
    width = args.get("width", WIDTH)
    layers: list[nn.Module] = [nn.Linear(IN, width), nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 16))
    return nn.Sequential(*layers)


def blocks(model: nn.Module) -> list[nn.Module]:
    if isinstance(model, Transformer):
        return list(model.layers)
    return [m for m in model if isinstance(m, nn.Linear)]


def compute_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch[0], batch[1]
    fail = _ARGS.get("fail")
    if fail == "forward_oom":
        total = torch.cuda.get_device_properties(x.device).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=x.device)
    if fail == "device_assert" and x.shape[0] == _ARGS.get("fail_micro", x.shape[0]):
        y = y + 1000  # out of range for 16 classes: the loss kernel's device-side assert
    if fail == "rank1" and torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
        raise RuntimeError("rank 1's forward failed (raised by the acceptance task)")
    if x.shape[0] < _ARGS.get("slow_below", 0):
        time.sleep(_ARGS.get("slow_ms", 0.0) / 1000.0)
    out = model(x)
    if _ARGS.get("alloc_log") and x.is_cuda:
        _record_allocator(_ARGS["alloc_log"])
    if fail == "backward_oom":
        out = _BackwardOOM.apply(out)
    return nn.functional.cross_entropy(out, y)


def build_optimizer(params: Any, args: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-4)


def analytic_flops_per_sample(width: int = WIDTH, model: str = "mlp") -> float:
    """FLOPs of one sample's forward and backward, by hand.

    A matmul of ``in x out`` weights costs 2 x in x out a row forward and twice that
    backward (input and weight gradients): 6 x the weights. What autograd skips: the
    first layer's input gradient (the data needs none), 2 x its weights a row.
    ``transformer``: per token 6 x the blocks' weights (the first block's input gradient
    is needed: its LayerNorm's weights are behind it), plus attention's scores and
    weighted sum, 4 x T x d a token forward (counted whole, causal or not, as
    FlopCounterMode counts ``scaled_dot_product_attention`` on CUDA) and twice that
    backward: nanoGPT's ``6N + 12 L H Q T`` a token; the head runs once a sample on the
    mean token. (FlopCounterMode counts no FLOPs for CPU's fused attention kernel; with
    the math backend it counts these.)"""
    if model == "transformer":
        block = 3 * D_MODEL**2 + D_MODEL**2 + 8 * D_MODEL**2
        per_token = 6 * LAYERS * block + 12 * LAYERS * SEQ * D_MODEL
        return float(SEQ * per_token + 6 * D_MODEL * 16)
    if model == "matmul":
        return 6.0 * (MATMUL_DEPTH * width**2 + width * 16) - 2.0 * width**2
    weights = IN * width + (DEPTH - 1) * width * width + width * 16
    return 6.0 * weights - 2.0 * IN * width
