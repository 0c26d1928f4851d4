"""One model preparation for every engine: :func:`parallelize`, in torchtitan's order.

1. The converters (``float8``), on the whole model.
2. Tensor (and sequence) parallelism: the task's own ``parallelize``, else the model's plan
   (:mod:`tuner.trial.tensor_parallel`).
3. The pipeline split: this rank keeps its stage (two, interleaved).
4. On each kept part: the sharding plan, channels-last, activation checkpointing, compile.
5. The data-parallel dimension: FSDP2's ``fully_shard`` or ``replicate`` over the ``dp``
   sub-mesh (:mod:`.data_parallel`), or DDP's buckets for a whole model. DeepSpeed wraps the
   model itself.

One ``DeviceMesh`` of shape ``(pp, dp, tp)`` per shape serves every trial of the process: a
new mesh makes process groups that torch never frees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from tuner.harness import distributed
from tuner.harness.distributed import ensure_process_group
from tuner.inputs import layout as layouts
from tuner.inputs.engine import kind
from tuner.trial import pipeline_stages, tensor_parallel
from tuner.trial.engines import data_parallel, model_levers, stages

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.task import Task

_MESHES: dict[tuple[str, int, int, int], tuple[Any, Any]] = {}
"""One mesh per shape for the process (see the module's docstring), beside the default group
it was made in: a library call that formed its own group takes it down on return
(:mod:`tuner.harness.caller_state`), and the next call's mesh must be made in the next group."""


distributed.when_destroyed(_MESHES.clear)  # a destroyed group's meshes (and their sub-groups' sockets) go too


def mesh_for(device: torch.device, pp: int, dp: int, tp: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    key = (device.type, pp, dp, tp)
    world = dist.group.WORLD
    if key not in _MESHES or _MESHES[key][0] is not world:
        _MESHES[key] = (world, init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp")))
    return _MESHES[key][1]


@dataclass
class Parallelized:
    """What :func:`parallelize` made of the task's model on this rank."""

    layout: layouts.Layout
    parts: list[nn.Module]
    """This rank's pieces: the whole model, or its pipeline stages (in ``indices`` order)."""
    model: Any
    """What the task's ``compute_loss`` receives: the part, DDP's wrapper, or the stages."""
    recompute: model_levers.Recompute | None
    """Times the checkpointed blocks' recompute (``None``: nothing is checkpointed)."""
    mesh: Any = None
    """The ``(pp, dp, tp)`` mesh, where a process group is in play."""
    indices: list[int] = field(default_factory=lambda: [0])
    """The pipeline stage index of each part."""
    stages: int = 1
    """How many stages the model was cut into (``pp`` x virtual stages per rank)."""
    tied: list[tuple[int, str]] = field(default_factory=list)
    """(part, parameter name) of this rank's copies of a parameter the first and last stages
    share (GPT-2's embedding and head), whose gradients the engine sums."""
    notes: list[str] = field(default_factory=list)
    after_step: list[Callable[[], None]] = field(default_factory=list)
    loss_parallel: tensor_parallel.LossParallel | None = None
    """The head's logits sharded over the vocabulary, the loss computed so (tensor parallelism
    without pipeline stages, a head PyTorch's styles split)."""

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]


def parallelize(module: nn.Module, task: "Task", config: "Plan", device: torch.device) -> Parallelized:
    """Prepare ``module`` for ``config`` on this rank, in the order of the module's docstring."""
    lay = config.layout
    mesh = None
    if lay.model_parallel or lay.shard:
        ensure_process_group(device)  # one rank still shards, over a world of one
        mesh = mesh_for(device, lay.pp, lay.dp, lay.tp)
    after = stages.convert(module, config)
    notes = _layout_notes(lay, config)
    styles = _plan(module, task, config, lay, notes) if lay.tp > 1 else {}
    count = lay.pp * lay.virtual_stages
    stage_index = lay.coordinates(dist.get_rank())[0] if mesh is not None else 0
    indices = [stage_index + k * lay.pp for k in range(lay.virtual_stages)]
    checkpointing = config.activation_checkpointing
    model_levers.without_kv_cache(module, checkpointing)
    tied_ids = {id(p) for p in pipeline_stages.tied(module)} if lay.pp > 1 and task.pipeline_split is None \
        else set()
    parts = _split(module, task, count, indices) if lay.pp > 1 else [module]
    tied = [(i, name) for i, part in enumerate(parts) for name, p in part.named_parameters() if id(p) in tied_ids]
    recompute = model_levers.Recompute(timed=device.type == "cpu" and not config.compile)
    for part in parts:
        if not kind(config.engine).wraps_model:  # DeepSpeed moves what it keeps
            part.to(device)
        if lay.tp > 1:
            _shard_tensors(part, styles, task, config, mesh["tp"])
        blocks, found = (list(part.layers), "") if isinstance(part, pipeline_stages.Stage) else \
            model_levers.find_blocks(part, task if lay.pp == 1 else None)
        if not lay.model_parallel and (lay.shard or checkpointing != "none" or config.compile):
            notes.append(found)  # which blocks the levers used, and how they were found
        notes += stages.model(part, blocks, config, recompute, device)
        if lay.shard:
            # Pipeline stages run each block's backward per micro-batch: resharding after the
            # forward would all-gather again for every one (torchtitan keeps them gathered too).
            data_parallel.shard(part, blocks, mesh["dp"], config, reshard=lay.reshard and lay.pp == 1,
                                offload=config.offload_optimizer == "cpu", pin=device.type == "cuda")
        elif lay.model_parallel and lay.dp > 1:
            data_parallel.replicate(part, blocks, mesh["dp"])
    model: Any = parts[0] if lay.pp == 1 else nn.ModuleList(parts)
    if kind(config.engine).ddp and dist.is_initialized() and dist.get_world_size() > 1:
        model = data_parallel.ddp(parts[0], config, device)
    return Parallelized(lay, parts, model, recompute if checkpointing != "none" else None, mesh, indices, count,
                        tied, notes, after, _loss_parallel(styles))


def _layout_notes(lay: layouts.Layout, config: "Plan") -> list[str]:
    """What a trial's result says of its layout (the degrees, and how the copies are kept)."""
    if not lay.model_parallel:
        return []
    return [f"layout: tensor_parallel {lay.tp}" + (" (sequence parallel)" if config.sequence_parallel else "")
            + f" x pipeline_parallel {lay.pp} x data-parallel {lay.dp}"
            + (f" ({lay.schedule}, {config.grad_accum_steps} micro-batches per pipeline step)" if lay.pp > 1 else "")]


def _loss_parallel(styles: dict[nn.Module, str]) -> tensor_parallel.LossParallel | None:
    """The switch on the head whose logits the plan leaves sharded, if one does."""
    head = next((m for m, style in styles.items() if style in tensor_parallel.LOSS_PARALLEL.values()), None)
    return tensor_parallel.LossParallel(head) if head is not None else None


def _plan(module: nn.Module, task: "Task", config: "Plan", lay: layouts.Layout,
          notes: list[str]) -> dict[nn.Module, str]:
    """The tensor-parallel plan's styles by module object, matched on the whole model's
    names (a stage or a wrapper renames them)."""
    if task.parallelize is not None:
        return {}
    plan, why = tensor_parallel.plan_of(module)
    if plan is not None:
        plan, said = tensor_parallel.with_vocab(module, plan, lay.tp)
        notes.append(f"tensor parallel: {said}")
    if plan is not None and config.sequence_parallel:
        plan, why = tensor_parallel.with_sequence(module, plan)
    if plan is None:
        raise ValueError(why)
    if lay.pp == 1:  # a stage's output goes through the schedule: gathered there
        plan, sharded = tensor_parallel.with_loss_parallel(plan)
        if sharded:
            notes.append("tensor parallel: the loss computed vocabulary-parallel (loss_parallel): each rank keeps "
                         "its shard of the logits")
    refused = tensor_parallel.refused(module, lay.tp)
    if refused:
        raise ValueError(refused)
    named = dict(module.named_modules())
    return {named[name]: style for name, style in tensor_parallel.matches(module, plan).items()}


def _split(module: nn.Module, task: "Task", count: int, indices: list[int]) -> list[nn.Module]:
    if task.pipeline_split is not None:
        parts = list(task.pipeline_split(module, count))
        if len(parts) != count or not all(isinstance(p, nn.Module) for p in parts):
            raise ValueError(f"the task's pipeline_split(model, {count}) must return {count} torch.nn.Module "
                             f"stages, got {len(parts)}")
        return [parts[i] for i in indices]
    return [pipeline_stages.stage(module, i, count) for i in indices]


def _shard_tensors(part: nn.Module, styles: dict[nn.Module, str], task: "Task", config: "Plan",
                   tp_mesh: Any) -> None:
    if task.parallelize is not None:
        task.parallelize(part, tp_mesh, config)
        return
    plan = {name: styles[m] for name, m in part.named_modules() if m in styles}
    if plan:  # a stage of only the embedding, or only the head, has nothing the plan names
        tensor_parallel.parallelize(part, tp_mesh, plan)
