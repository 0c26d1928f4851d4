"""The data-parallel dimension of the own-loop engines, the one module that calls it: FSDP2's
``fully_shard`` or ``replicate``, per block and on the root, over the ``dp`` mesh, or DDP
for a whole model.

- ``fully_shard`` (``fsdp: full_shard / shard_grad_op``): parameters, gradients and the
  optimizer's state sharded; mixed precision is its ``MixedPrecisionPolicy``.
- ``replicate`` (several model copies beside tensor or pipeline parallelism): DDP's
  arithmetic on FSDP2's machinery, each block's gradients all-reduced as its backward ends,
  overlapping the backward below it; it takes DTensor parameters (torchtitan refuses DDP
  beside other parallelism).

Both accumulate without communicating until the last micro-batch
(``set_requires_gradient_sync``, which PyTorch's pipeline schedules also drive).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tuner.inputs.library_configs import ddp_kwargs
from tuner.trial.engines.model_levers import DTYPES

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan


def policy(config: "Plan") -> Any:
    """Parameters in the trial's AMP dtype for compute, gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    param_dtype = DTYPES[config.amp_dtype] if config.amp_dtype != "fp32" else None
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def shard(module: nn.Module, blocks: list[nn.Module], mesh: Any, config: "Plan", *, reshard: bool,
          offload: bool = False, pin: bool = False) -> Any:
    """``fully_shard`` each block, then the root (what the blocks leave: embeddings, head)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    mp = policy(config)
    where = CPUOffloadPolicy(pin_memory=pin) if offload else OffloadPolicy()
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=where, reshard_after_forward=reshard)
    return fully_shard(module, mesh=mesh, mp_policy=mp, offload_policy=where, reshard_after_forward=reshard)


def replicate(module: nn.Module, blocks: list[nn.Module], mesh: Any) -> Any:
    """Replicate each block, then the root: one gradient all-reduce per block, overlapped
    with the backward. Parameters stay in fp32 (the forward's autocast casts, as without
    it), so the curve is the one the per-parameter average trained."""
    from torch.distributed._composable.replicate_with_fsdp import replicate as replicate_module

    for block in blocks:
        replicate_module(block, mesh=mesh)
    return replicate_module(module, mesh=mesh)


def ddp(module: nn.Module, config: "Plan", device: torch.device) -> Any:
    """DDP over the world: gradients in buckets of ``ddp_bucket_cap_mb``, all-reduced from C++
    as each bucket fills during the backward, as views of them or copied
    (``gradient_as_bucket_view``), the graph searched each step or taken as fixed
    (``static_graph``): its three levers."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                   **ddp_kwargs(config))


def set_sync(parts: list[nn.Module], last: bool) -> None:
    """Communicate gradients only on the micro-batch that closes the accumulation."""
    for part in parts:
        sync = getattr(part, "set_requires_gradient_sync", None)
        if sync is not None:
            sync(last)
