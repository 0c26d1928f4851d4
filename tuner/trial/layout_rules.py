"""Which tensor- and pipeline-parallel degrees a task's model can take, decided before any
trial: each refused value leaves the space with a line naming the rule.

The model is built once on PyTorch's ``meta`` device (shapes, no memory, no weights
initialised: a Llama-style model of any size builds in milliseconds), else, where the
task's builder refuses that device, as the trials build it. The rules that depend on one
lever's value alone are applied here; those of a combination (tp x pp against the world,
a schedule's micro-batches, fp16) by :mod:`tuner.inputs.rules`, per
configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from tuner.inputs.levers import LEVERS
from tuner.trial import pipeline_stages, tensor_parallel

if TYPE_CHECKING:
    from tuner.inputs.task import Task


@dataclass
class Verdicts:
    """The degrees refused, with why, and the model's block count (``None``: unknown)."""

    refused: dict[tuple[str, int], str] = field(default_factory=dict)
    blocks: int | None = None


def _build(task: "Task", task_args: dict[str, Any]) -> torch.nn.Module:
    try:
        with torch.device("meta"):
            return task.build_model(task_args)
    except Exception:  # noqa: BLE001 - a builder that loads weights or checks devices: build it as trials do
        return task.build_model(task_args)


def restrict(choices: dict[str, tuple[Any, ...]], task: "Task | None", task_args: dict[str, Any], world: int,
             per_node: int | None, script: bool, notes: list[str]) -> int | None:
    """Take out of ``choices`` (the space, in place) every degree the task's model cannot
    take, each with a note naming the rule; returns the model's block count (``None``:
    unknown). A searched ZeRO stage beside tensor/pipeline parallelism is said too: the
    layouts shard with FSDP2 (DeepSpeed's engine takes no DeviceMesh)."""
    verdicts = judge(task, task_args, choices["tensor_parallel"], choices["pipeline_parallel"], world, per_node,
                     script, True in choices["sequence_parallel"]) if world > 1 else Verdicts()
    for (name, value), why in verdicts.refused.items():
        choices[name] = tuple(v for v in choices[name] if v != value) or (LEVERS[name].default,)
        notes.append(f"{name}={value} refused: {why}")
    zero = choices["zero_stage"]
    if max(choices["tensor_parallel"]) * max(choices["pipeline_parallel"]) > 1 and (len(zero) > 1 or zero[0] != 0):
        notes.append("zero_stage applies only without tensor/pipeline parallelism (DeepSpeed's engine takes no "
                     "PyTorch DeviceMesh): the layouts shard their data-parallel dimension with FSDP2")
    return verdicts.blocks


def judge(task: "Task | None", task_args: dict[str, Any], tp_values: tuple[int, ...], pp_values: tuple[int, ...],
          world: int, per_node: int | None, script: bool, sequence: bool = False) -> Verdicts:
    """The verdict on each searched degree above 1 of ``tensor_parallel`` and
    ``pipeline_parallel``, and on ``sequence_parallel: true`` when ``sequence``."""
    out = Verdicts()
    wanted = [("tensor_parallel", v) for v in tp_values if v > 1] + [("pipeline_parallel", v) for v in pp_values
                                                                     if v > 1]
    if sequence and max(tp_values) > 1:
        wanted.append(("sequence_parallel", True))
    if not wanted:
        return out
    for name, value in wanted:
        if script or task is None:
            out.refused[(name, value)] = ("script mode runs the script's own model: tensor and pipeline "
                                          "parallelism are searched in task mode (a task's build_model)")
        elif world % value:
            out.refused[(name, value)] = f"{value} does not divide the world of {world} ranks"
        elif name == "tensor_parallel" and per_node is not None and value > per_node:
            out.refused[(name, value)] = (f"a tensor-parallel group stays inside one node, which has {per_node} "
                                          "ranks")
    left = [(n, v) for n, v in wanted if (n, v) not in out.refused]
    if not left:
        return out
    assert task is not None
    model = _build(task, task_args)
    if pipeline_stages.family(model) is not None:
        out.blocks = len(pipeline_stages.blocks_of(model))
    for name, value in left:
        if name == "sequence_parallel":
            why = _sequence(model, task, task_args, tuple(v for v in tp_values if v > 1))
        elif name == "tensor_parallel":
            why = _tensor(model, task, value)
        else:
            why = _pipeline(model, task, value, out.blocks)
        if why:
            out.refused[(name, value)] = why
    return out


def _tensor(model: torch.nn.Module, task: "Task", degree: int) -> str | None:
    if task.parallelize is not None:
        return None
    plan, why = tensor_parallel.plan_of(model)
    if plan is None:
        return why + " (or give the task a parallelize(model, mesh, config))"
    if not tensor_parallel.matches(model, plan):
        return f"{type(model).__name__}'s tensor-parallel plan names none of its modules"
    why = tensor_parallel.refused(model, degree)
    return why.removeprefix("tensor_parallel: ") if why else None


def _sequence(model: torch.nn.Module, task: "Task", task_args: dict[str, Any], degrees: tuple[int, ...]) -> str | None:
    if task.parallelize is not None:
        return "the task's own parallelize(model, mesh, config) decides its sequence sharding"
    plan = tensor_parallel.plan_of(model)[0]
    if plan is None:
        return "the model has no tensor-parallel plan to shard the sequence between"
    sequenced, said = tensor_parallel.with_sequence(model, plan)
    why = said if sequenced is None else None
    length = task.tokens_per_sample(task_args) if task.tokens_per_sample is not None else None
    odd = [d for d in degrees if length and length % d]
    if why is None and odd:
        why = f"the sequence ({length} tokens) does not divide by tensor_parallel {odd[0]}"
    return why.removeprefix("sequence_parallel: ") if why else None


def _pipeline(model: torch.nn.Module, task: "Task", stages: int, blocks: int | None) -> str | None:
    if task.pipeline_split is not None:
        return None
    why = pipeline_stages.supported(model)
    if why:
        return why
    if blocks is not None and blocks < stages:
        return f"{stages} stages need at least {stages} blocks; the model has {blocks}"
    return None


def rank_parameters(model: torch.nn.Module, tp: int, pp: int, virtual: int = 1) -> int:
    """The most parameter elements any rank holds under this layout (the memory model's
    states): the stages' own blocks, the first stage's embedding and the last's norm and
    head (the busiest rank's virtual stages, summed), each module the tensor-parallel plan
    names divided by ``tp`` (the projections, and the embedding and head where the
    vocabulary divides; the norms are replicated). A model the tuner cannot cut is taken
    as ``1 / pp`` of the whole."""
    plan = tensor_parallel.plan_of(model)[0] if tp > 1 else None
    plan = tensor_parallel.with_vocab(model, plan, tp)[0] if plan else None
    named = dict(model.named_modules())
    sharded = {named[n] for n in tensor_parallel.matches(model, plan)} if plan else set()

    def count(module: torch.nn.Module) -> float:
        """Each parameter once (a tied head is the embedding's), a sharded module's / tp."""
        seen: set[int] = set()

        def walk(m: torch.nn.Module) -> float:
            own = [p for p in m.parameters(recurse=False) if id(p) not in seen]
            seen.update(id(p) for p in own)
            size = sum(p.numel() for p in own)
            return sum(walk(c) for c in m.children()) + (size / tp if m in sharded else size)

        return walk(module)

    if pp == 1:
        return round(count(model))
    if pipeline_stages.supported(model) is not None:
        return round(count(model) / pp)
    stages = pp * virtual
    parts = pipeline_stages.split(len(pipeline_stages.blocks_of(model)), stages)
    per_stage = [count(pipeline_stages.Stage(model, part, i == 0, i == stages - 1)) for i, part in enumerate(parts)]
    return round(max(sum(per_stage[r + k * pp] for k in range(virtual)) for r in range(pp)))
