"""DeepSpeed: ZeRO stages 0-3, bf16/fp16 handled by its optimizer wrappers.

DeepSpeed divides the loss by the accumulation steps itself and only steps the optimizer
at the accumulation boundary, so every micro-batch calls ``engine.step()``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch

from tuner.harness.distributed import ensure_process_group
from tuner.inputs.library_configs import ds_config
from tuner.trial.data import cast_floats
from tuner.trial.engines.base import Engine

if TYPE_CHECKING:
    from tuner.harness.comm import CommTimer
    from tuner.inputs.plan import Plan


_prepared = False


def prepare(device: torch.device) -> None:
    """Once per process, before the first trial: everything DeepSpeed loads only once.

    That is its import, the process group, the JIT build of its communication extension
    (about a minute the very first time, in a compiler subprocess) and the modules it
    imports lazily when it first builds a ZeRO optimizer (seen in 0.19: ~600 modules,
    torch._inductor among them, +44 MiB PSS). A throw-away engine per ZeRO family loads
    them here, so that no trial's build time or peak memory carries a one-time cost and
    the first trial of a process measures like the tenth.
    """
    global _prepared
    if _prepared:
        return
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)  # its INFO lines would drown the table
    _group(device)
    world = torch.distributed.get_world_size()
    for stage in (1, 3):
        from tuner.inputs.plan import Plan

        config = Plan.of(world, "deepspeed", micro_batch_size=1, grad_accum_steps=1, zero_stage=stage)
        engine = DeepSpeedEngine(
            torch.nn.Linear(8, 8), lambda p: torch.optim.AdamW(p), lambda m, b: m(b).sum(), config, device
        )
        engine.forward_backward(torch.ones(1, 8, device=device), last=True)
        engine.close()
        del engine
    _prepared = True


def _group(device: torch.device) -> None:
    """The process group DeepSpeed trains in, formed where there is none (a lone process
    gets a world of one, not MPI discovery), and DeepSpeed's own handle on it. A library
    call takes down a group it formed when it returns (:mod:`tuner.harness.caller_state`), so
    each trial sees to it; a group the caller formed without torchrun's variables is used
    as it is (DeepSpeed insists on ``LOCAL_RANK``: the device's index)."""
    import deepspeed

    ensure_process_group(device)
    os.environ.setdefault("LOCAL_RANK", str(device.index or 0))
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo", verbose=False)


class DeepSpeedEngine(Engine):
    def __init__(
        self,
        module: torch.nn.Module,
        make_optimizer: Callable[[Any], torch.optim.Optimizer],
        compute_loss: Callable[[Any, Any], torch.Tensor],
        config: "Plan",
        device: torch.device,
    ) -> None:
        super().__init__(config, device)
        import deepspeed

        _group(device)
        module.to(device)
        optimizer = make_optimizer(module.parameters())
        self.ds_config = ds_config(config, cuda=device.type == "cuda")
        """Exactly what ``ds_config.json`` exports for this configuration on this device."""
        cfg = dict(self.ds_config)
        # The user's optimizer is a torch one DeepSpeed may not list as tested for ZeRO; and
        # no progress lines in the measured loop. Neither changes what runs.
        cfg["zero_allow_untested_optimizer"] = True
        cfg["steps_per_print"] = 2**31 - 1
        self.model, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=cfg)
        self.compute_loss = compute_loss
        model_dtype = self.model.get_data_types()[0]
        self.half: torch.dtype | None = model_dtype if model_dtype in (torch.bfloat16, torch.float16) else None
        """The engine's half-precision weight dtype, that float inputs are cast to."""

    def forward(self, batch: Any, last: bool) -> torch.Tensor:
        # With bf16/fp16 DeepSpeed holds half-precision weights and turns an outer autocast
        # off on CUDA: the inputs are cast instead (see cast_floats).
        if self.half is not None:
            batch = cast_floats(batch, self.half)
        return self.compute_loss(self.model, batch)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.model.backward(loss)
        self.model.step()  # steps the optimizer only at the accumulation boundary

    def optimizer_step(self) -> None:
        """Nothing left to do: the last ``engine.step()`` was the optimizer step."""

    def time_collectives(self, timer: "CommTimer") -> ContextManager[Any]:
        """ZeRO calls ``deepspeed.comm`` functions by attribute (``dist.all_reduce``):
        wrapping them there sees every collective it makes, and the waits on async ones."""
        if self.device.type != "cpu" or torch.distributed.get_world_size() == 1:
            return contextlib.nullcontext()
        import deepspeed.comm

        from tuner.harness.comm import DEEPSPEED_COLLECTIVES

        return timer.patched(deepspeed.comm, DEEPSPEED_COLLECTIVES)

    def _release(self) -> None:
        self.model.destroy()
        del self.model, self.compute_loss
        _forget_zero3_globals()
        gc.collect()


def _forget_zero3_globals() -> None:
    """Drop what ZeRO-3 keeps in module and class globals after ``engine.destroy()``
    (DeepSpeed 0.19): ``parameter_offload.FWD_MODULE_STACK`` lists the model, the class-level
    ``lru_cache`` ``PartitionedParameterCoordinator.__params_to_release`` holds every submodule
    and its partitioned parameters, and ZeRO-3's replacement of ``torch.nn.functional.linear``
    would run every later trial's ``nn.Linear``. One engine lives at a time in a trial process,
    so resetting all three here is safe.
    """
    try:
        from deepspeed.runtime.zero import parameter_offload, partition_parameters, partitioned_param_coordinator
    except ImportError:
        return
    original_linear = getattr(partition_parameters.InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
    if original_linear is not None:
        torch.nn.functional.linear = original_linear
    stack = getattr(parameter_offload, "FWD_MODULE_STACK", None)
    if isinstance(stack, list):
        stack.clear()
    cls = getattr(partitioned_param_coordinator, "PartitionedParameterCoordinator", None)
    fn = vars(cls).get("_PartitionedParameterCoordinator__params_to_release") if cls else None
    # instrument_w_nvtx wraps the lru_cache in a closure (no __wrapped__): look in both.
    pending = [fn] if fn is not None else []
    while pending:
        f = pending.pop()
        if hasattr(f, "cache_clear"):
            f.cache_clear()
            continue
        pending += [c.cell_contents for c in getattr(f, "__closure__", None) or () if callable(c.cell_contents)]
        if getattr(f, "__wrapped__", None) is not None:
            pending.append(f.__wrapped__)
