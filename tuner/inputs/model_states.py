"""The memory terms of the levers that move a rank's model states (``Lever.memory.states``): each
says what share of the parameters, the gradients and the optimizer states (in fp32 bytes:
4 + 4 + 8 per parameter, AdamW's two moments) stays on one rank's device, and the memory
model multiplies them. ZeRO and FSDP2 never go together, so their shares compose.

- ZeRO 1 / 2 / 3 divide the optimizer states / + gradients / + parameters by the
  data-parallel ranks; DeepSpeed in bf16 / fp16 keeps half-precision parameters and
  gradients beside fp32 master weights in its optimizer (2 + 2 + 12 bytes).
- FSDP2 divides gradients and optimizer states, and the parameters between uses when it
  reshards after the forward (``shard_grad_op`` keeps them gathered to the backward).
- Offload moves the optimizer states (and FSDP2's shards) to the host, which on a CPU-only
  machine is the same memory.
"""

from __future__ import annotations

from tuner.inputs.plan import Plan

Shares = tuple[float, float, float]
"""(parameters, gradients, optimizer states) kept on a rank's device, against fp32 unsharded."""


def zero_states(plan: Plan, world_size: int, host_is_device: bool) -> Shares:
    zero = plan.sharding.zero_stage
    params, grads, optim = (0.5, 0.5, 1.5) if zero > 0 and plan.precision.amp_dtype != "fp32" else (1, 1, 1)
    w = max(1, world_size)
    return (params / w if zero >= 3 else params, grads / w if zero >= 2 else grads, optim / w if zero >= 1 else optim)


def sharded_states(plan: Plan, world_size: int, host_is_device: bool) -> Shares:
    lay, w = plan.layout, max(1, world_size)
    if not lay.shard:
        return (1, 1, 1)
    return (1 / w if lay.reshard else 1, 1 / w, 1 / w)


def offloaded_states(plan: Plan, world_size: int, host_is_device: bool) -> Shares:
    if plan.sharding.offload_optimizer == "none" or host_is_device:
        return (1, 1, 1)
    return (0, 0, 0) if plan.layout.shard else (1, 1, 0)
