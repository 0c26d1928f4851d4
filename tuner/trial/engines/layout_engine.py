"""The parallel layout: tensor and pipeline parallelism, with FSDP2 or replication on the
data-parallel dimension, composed as torchtitan composes them (issue 27).

One ``DeviceMesh`` of shape ``(pp, dp, tp)`` (:mod:`tuner.config.layout`). In order:

1. The tensor-parallel plan is matched against the whole model's module names (the task's
   own ``parallelize`` wins; else the model's shipped plan, :mod:`tuner.trial.tensor_parallel`).
2. With ``pipeline_parallel`` the model is cut into stages (the task's ``pipeline_split``
   or :mod:`tuner.trial.pipeline_parallel`); this rank keeps its stage (two under the
   interleaved schedule: ``s`` and ``s + pp``) and drops the rest.
3. Tensor parallelism on what this rank kept, over the ``tp`` sub-mesh; then checkpointing
   and compile on its blocks, then FSDP2 (``fsdp`` on) on the ``dp`` sub-mesh, per block
   and per stage; without it, FSDP2's ``replicate`` there when there are model copies
   (one gradient all-reduce per block, overlapped with the backward: :mod:`.data_parallel`).
4. A step: without stages, each micro-batch is the task's ``compute_loss`` as in the other
   engines; with stages, the micro-batches of one optimizer step are gathered and run by
   PyTorch's schedule (``accumulation`` micro-batches per pipeline step), and the last
   stage's loss is sent to the others, so every rank records the same curve. Each
   pipeline step is timed with the stages' work inside it: the bubble share
   (:mod:`tuner.trial.engines.pipeline_clock`).

fp16 is refused for these layouts (:func:`tuner.config.layout.refusal`); bf16 is FSDP2's
``MixedPrecisionPolicy`` when sharded, autocast otherwise.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import nn

from tuner.config import layout as layouts
from tuner.harness.distributed import ensure_process_group
from tuner.trial import pipeline_parallel, tensor_parallel
from tuner.trial.engines import data_parallel, levers, stages
from tuner.trial.engines.base import OwnLoopEngine, autocast
from tuner.trial.engines.fsdp_engine import FSDP_COLLECTIVES
from tuner.trial.engines.pipeline_clock import PipelineClock

if TYPE_CHECKING:
    from tuner.config.space import Config
    from tuner.config.task import Task
    from tuner.harness.comm import CommTimer

FUNCTIONAL = ("all_reduce", "reduce_scatter_tensor", "all_gather_tensor", "wait_tensor")
"""The functional collectives DTensor's redistributions call (torch 2.13), and their wait."""
_MESHES: dict[tuple[str, int, int, int], Any] = {}
"""One mesh per shape for the process: each new mesh makes new process groups, which
torch never frees before the process ends."""


def mesh_for(device: torch.device, pp: int, dp: int, tp: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    key = (device.type, pp, dp, tp)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    return _MESHES[key]


_ENDS: dict[tuple[int, int, int, int], Any] = {}


def _ends_group(lay: layouts.Layout, rank: int) -> Any:
    """The group of the first and the last pipeline stage of ``rank``'s model copy. Every
    rank creates every such group, in the same order, once per layout (``new_group`` is
    collective); the pipeline's own group is it when there are two stages."""
    key = (lay.tp, lay.pp, lay.dp, rank)
    if key not in _ENDS:
        mine = None
        for d in range(lay.dp):
            for t in range(lay.tp):
                pair = [d * lay.tp + t, ((lay.pp - 1) * lay.dp + d) * lay.tp + t]
                group = dist.new_group(pair)
                if rank in pair:
                    mine = group
        _ENDS[key] = mine
    return _ENDS[key]


def _local(grad: torch.Tensor) -> torch.Tensor:
    """A gradient's local shard: a DTensor's (tensor parallelism, FSDP2) or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return grad.to_local() if isinstance(grad, DTensor) else grad


class LayoutEngine(OwnLoopEngine):
    def __init__(self, module: nn.Module, task: "Task", make_optimizer: Callable[[Any], torch.optim.Optimizer],
                 config: "Config", device: torch.device, world_size: int) -> None:
        super().__init__(config, device)
        ensure_process_group(device)
        self.layout = layouts.Layout(config.tensor_parallel, config.pipeline_parallel, world_size)
        lay = self.layout
        self.mesh = mesh_for(device, lay.pp, lay.dp, lay.tp)
        stage_index, _, _ = lay.coordinates(dist.get_rank())
        self.compute_loss, self.scaler = task.compute_loss, None
        self.after_step = stages.convert(module, config)  # the whole model's layers, before any cut or shard
        styles = self._plan(module, task) if lay.tp > 1 else {}
        virtual = layouts.VIRTUAL_STAGES[config.pipeline_schedule] if lay.pp > 1 else 1
        count = lay.pp * virtual
        indices = [stage_index + k * lay.pp for k in range(virtual)] if lay.pp > 1 else [0]
        levers.without_kv_cache(module, config.activation_checkpointing)
        tied = {id(p) for p in pipeline_parallel.tied(module)} if lay.pp > 1 and task.pipeline_split is None else set()
        parts = self._split(module, task, count, indices) if lay.pp > 1 else [module]
        self.tied = [(i, name) for i, part in enumerate(parts) for name, p in part.named_parameters() if id(p) in tied]
        """(part, parameter name) of this rank's copies of a parameter the first and last stages share."""
        del module
        self.recompute = levers.Recompute(timed=device.type == "cpu" and not config.compile)
        for part in parts:
            part.to(device)
            if lay.tp > 1:
                self._shard_tensors(part, styles, task, config)
            blocks = list(part.layers) if isinstance(part, pipeline_parallel.Stage) else \
                levers.find_blocks(part, task if lay.pp == 1 else None)[0]
            levers.checkpoint_blocks(blocks, config.activation_checkpointing, self.recompute,
                                     lambda: stages.forward(config))
            if config.compile:
                levers.compile_model(part, blocks, config)
            self._data_parallel(part, blocks)
        self.parts = parts
        self.model: Any = parts[0] if lay.pp == 1 else nn.ModuleList(parts)
        self.optimizer = make_optimizer([p for part in parts for p in part.parameters()])
        self.clock = PipelineClock(device)
        """Each pipeline step and the stages' work inside it: the bubble (:mod:`.pipeline_clock`)."""
        self.schedule = self._schedule(parts, indices, count, task) if lay.pp > 1 else None
        self.pending: list[Any] = []
        self.checked, self.task_split = False, task.pipeline_split is not None
        self.notes.append(f"layout: tensor_parallel {lay.tp}" + (" (sequence parallel)" if config.sequence_parallel
                                                                   else "")
                          + f" x pipeline_parallel {lay.pp} x data-parallel {lay.dp}"
                          + (f" ({config.pipeline_schedule}, {config.grad_accum_steps} micro-batches per pipeline "
                             "step)" if lay.pp > 1 else ""))

    # --- building -----------------------------------------------------------------------

    def _plan(self, module: nn.Module, task: "Task") -> dict[nn.Module, str]:
        """The plan's styles by module object, matched on the whole model's names (a stage
        or a wrapper renames them)."""
        if task.parallelize is not None:
            return {}
        plan, why = tensor_parallel.plan_of(module)
        if plan is not None:
            plan, said = tensor_parallel.with_vocab(module, plan, self.layout.tp)
            self.notes.append(f"tensor parallel: {said}")
        if plan is not None and self.config.sequence_parallel:
            plan, why = tensor_parallel.with_sequence(module, plan)
        if plan is None:
            raise ValueError(why)
        refused = tensor_parallel.refused(module, self.layout.tp)
        if refused:
            raise ValueError(refused)
        named = dict(module.named_modules())
        return {named[name]: style for name, style in tensor_parallel.matches(module, plan).items()}

    def _split(self, module: nn.Module, task: "Task", count: int, indices: list[int]) -> list[nn.Module]:
        if task.pipeline_split is not None:
            parts = list(task.pipeline_split(module, count))
            if len(parts) != count or not all(isinstance(p, nn.Module) for p in parts):
                raise ValueError(f"the task's pipeline_split(model, {count}) must return {count} torch.nn.Module "
                                 f"stages, got {len(parts)}")
            return [parts[i] for i in indices]
        return [pipeline_parallel.stage(module, i, count) for i in indices]

    def _shard_tensors(self, part: nn.Module, styles: dict[nn.Module, str], task: "Task", config: "Config") -> None:
        tp_mesh = self.mesh["tp"]
        if task.parallelize is not None:
            task.parallelize(part, tp_mesh, config)
            return
        plan = {name: styles[m] for name, m in part.named_modules() if m in styles}
        if plan:  # a stage of only the embedding, or only the head, has nothing the plan names
            tensor_parallel.parallelize(part, tp_mesh, plan)

    def _data_parallel(self, part: nn.Module, blocks: list[nn.Module]) -> None:
        """FSDP2 over the ``dp`` sub-mesh when sharding, else its ``replicate`` when there
        are model copies: per block, gradients averaged in one all-reduce each, overlapped
        with the backward (:mod:`.data_parallel`)."""
        if self.config.fsdp != "off":
            # Pipeline stages run each block's backward per micro-batch: resharding after the
            # forward would all-gather again for every one (torchtitan keeps them gathered too).
            reshard = self.config.fsdp == "full_shard" and self.layout.pp == 1
            data_parallel.shard(part, blocks, self.mesh["dp"], self.config, reshard=reshard)
        elif self.layout.dp > 1:
            data_parallel.replicate(part, blocks, self.mesh["dp"])

    def _schedule(self, parts: list[nn.Module], indices: list[int], count: int, task: "Task") -> Any:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        group = self.mesh["pp"].get_group()
        stages = [PipelineStage(part, i, count, self.device, group=group) for part, i in zip(parts, indices)]
        for stage in stages:
            self.clock.watch(stage)
        loss = task.pipeline_loss or pipeline_parallel.next_token_loss
        accum = self.config.grad_accum_steps
        if self.config.pipeline_schedule == "interleaved_1f1b":
            return ScheduleInterleaved1F1B(stages, n_microbatches=accum, loss_fn=loss)
        cls = ScheduleGPipe if self.config.pipeline_schedule == "gpipe" else Schedule1F1B
        return cls(stages[0], n_microbatches=accum, loss_fn=loss)

    # --- a step ---------------------------------------------------------------------------

    def forward(self, batch: Any, last: bool) -> torch.Tensor:
        data_parallel.set_sync(self.parts, last)
        if self.schedule is None:
            with autocast(self.device, self.config.amp_dtype):
                return self.compute_loss(self.model, batch)
        self.pending.append(batch)
        if not last:  # the schedule runs the step's micro-batches together, on the last
            return torch.zeros((), device=self.device)
        return self._pipeline_step()

    def _pipeline_step(self) -> torch.Tensor:
        """Run the step's micro-batches through the stages; the sum of their losses, sent
        from the last stage to every stage (the loop divides by the accumulation)."""
        if not self.checked and self.task_split is False:
            why = pipeline_parallel.padding_refused(self.pending[0])
            if why:
                raise ValueError(why)
        self.checked = True
        inputs = torch.cat([pipeline_parallel.input_ids(b) for b in self.pending]).to(self.device)
        target = torch.cat([pipeline_parallel.target_ids(b) for b in self.pending]).to(self.device)
        self.pending = []
        losses: list[torch.Tensor] = []
        stage = self.layout.coordinates(dist.get_rank())[0]
        assert self.schedule is not None
        with autocast(self.device, self.config.amp_dtype):
            if stage == 0:
                self.clock.step(self.schedule.step, inputs, target=target, losses=losses)
            else:
                self.clock.step(self.schedule.step, target=target, losses=losses)
        total = torch.stack([x.detach().float() for x in losses]).sum() if losses \
            else torch.zeros((), device=self.device)
        dist.broadcast(total, group=self.mesh["pp"].get_group(), group_src=self.layout.pp - 1)
        return total

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        if self.schedule is None:  # the schedule ran its own backward
            super().backward(loss, last)

    def optimizer_step(self) -> None:
        if self.tied:
            self._sum_tied()
        super().optimizer_step()

    def _sum_tied(self) -> None:
        """A tied embedding's two copies (first stage: its input, last: its output) get the
        sum of their gradients, so they stay the one parameter the whole model has."""
        group = _ends_group(self.layout, dist.get_rank())
        parts = [dict(part.named_parameters()) for part in self.parts]
        for i, name in self.tied:
            grad = parts[i][name].grad
            if grad is not None:
                dist.all_reduce(_local(grad), group=group)

    def time_collectives(self, timer: "CommTimer") -> ContextManager[Any]:
        """On CPU/gloo, the host time of the collectives: FSDP2's (sharded or replicated:
        ``torch.distributed``), GPT-2's hand-made tensor-parallel ones (the same), and
        DTensor's tensor-parallel ones, which it issues through the functional collectives
        (``torch.distributed._functional_collectives``: the call, then ``wait_tensor`` where
        the result is first used). Not the stages' sends and receives (``P2POp`` accepts
        only ``dist.isend`` / ``dist.irecv`` themselves, so they cannot be wrapped): the
        bubble share holds them. On a GPU the profiled window counts all of it, from the
        kernels."""
        if self.device.type != "cpu":
            return contextlib.nullcontext()
        import torch.distributed._functional_collectives as funcol

        stack = contextlib.ExitStack()
        stack.enter_context(timer.patched(dist, FSDP_COLLECTIVES))
        stack.enter_context(timer.patched(funcol, FUNCTIONAL))
        return stack

    def close(self) -> None:
        super().close()
        self.parts, self.schedule, self.pending = [], None, []
