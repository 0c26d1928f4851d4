"""FSDP2: ``torch.distributed.fsdp.fully_shard`` on each block and on the root
(:mod:`.data_parallel`, called by :func:`tuner.trial.engines.parallelize.parallelize`).

- ``fsdp: full_shard`` reshards each block's parameters after its forward and gathers them
  again for the backward (ZeRO-3's memory); ``shard_grad_op`` keeps them gathered from
  the forward to the backward (``reshard_after_forward=False``: ZeRO-2's memory, one
  all-gather fewer per block).
- Mixed precision is FSDP2's ``MixedPrecisionPolicy``: parameters cast to the trial's AMP
  dtype for compute, gradients reduced in fp32 (``reduce_dtype``), the optimizer on fp32
  shards. The forward also runs under autocast, as the other engines' do, so that the
  task's own loss arithmetic (softmax, cross-entropy) keeps autocast's fp32 rules.
- ``offload_optimizer: cpu`` is FSDP2's ``CPUOffloadPolicy``: sharded parameters,
  gradients and the optimizer step live on the host.
- Gradient accumulation skips the reduce-scatter until the last micro-batch
  (``set_requires_gradient_sync``), as DDP's ``no_sync`` does.

Runs on CPU with gloo (checked on torch 2.13: full_shard / shard_grad_op x fp32 / bf16,
with checkpointing, compile and offload), so it is tested for real.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch
import torch.distributed as dist

from tuner.trial.engines.base import OwnLoopEngine, autocast

if TYPE_CHECKING:
    from tuner.config.space import Config
    from tuner.harness.comm import CommTimer

FSDP_COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce", "all_gather_into_tensor",
                    "reduce_scatter_tensor")
"""``torch.distributed`` functions FSDP2 calls (by attribute, at call time) for its
all-gathers and reduce-scatters (torch 2.13's ``_fsdp_collectives``)."""


class FSDPEngine(OwnLoopEngine):
    def __init__(
        self,
        model: Any,
        make_optimizer: Callable[[Any], torch.optim.Optimizer],
        compute_loss: Callable[[Any, Any], torch.Tensor],
        config: "Config",
        device: torch.device,
    ) -> None:
        """``model`` is sharded already (:func:`tuner.trial.engines.parallelize.parallelize`)."""
        super().__init__(config, device)
        self.model = model
        self.optimizer = make_optimizer(model.parameters())
        self.compute_loss = compute_loss
        self.scaler = None
        if config.amp_dtype == "fp16":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = ShardedGradScaler(device.type)

    def forward(self, batch: Any, last: bool) -> torch.Tensor:
        self.model.set_requires_gradient_sync(last)
        with autocast(self.device, self.config.amp_dtype):
            return self.compute_loss(self.model, batch)


    def time_collectives(self, timer: "CommTimer") -> ContextManager[Any]:
        """FSDP2's all-gathers and reduce-scatters are Python calls into ``torch.distributed``
        (asynchronous ones waited on later): wrapping them there times the call and the wait."""
        if self.device.type != "cpu" or dist.get_world_size() == 1:
            return contextlib.nullcontext()
        return timer.patched(dist, FSDP_COLLECTIVES)
