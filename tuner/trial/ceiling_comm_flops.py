"""Steps outside the measured window, each after it so the window pays nothing for them:
the stall-free ceiling, the GPU profiler window for exposed communication, the FLOP count."""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Any

import torch

from tuner.harness import comm_tail, distributed
from tuner.harness.probe_core import ProbeCore
from tuner.harness.system.flops import count_flops, uses_attention
from tuner.inputs.engine import kind
from tuner.trial.failures import TrialStop

if TYPE_CHECKING:
    from tuner.harness.metrics import Window
    from tuner.inputs.task import Task
    from tuner.trial.loop import TrialLoop

STALL_FREE_STEPS = 10
"""Steps measured for the stall-free ceiling (fewer when the window itself is shorter)."""
CEILING_FROM_WINDOW_BELOW = 0.05
"""A window that waited for data less than this share of its time (on every rank) takes
its stall-free ceiling from its own steps less their waits, instead of ten more steps: the
ceiling is then at most 1/0.95 of the measured rate, too close for any verdict to turn on
(data-bound needs a 10% wait), and the extra steps would cost a short trial a sixth of its time."""

_FLOPS: dict[str, float | None] = {}
"""FLOPs per sample, counted once per task and task_args in this process."""
_ATTENTION: dict[str, bool] = {}
"""Whether the task's step calls scaled_dot_product_attention, where a count saw its calls."""


REPLAYED, WINDOW_MINUS_WAITS = "replayed", "window minus waits"
"""The values of the ``stall_free_method`` metric."""


def stall_free(job: "TrialLoop", window: "Window") -> tuple[list[float], str]:
    """``(step times, how they were had)``: the step on the last batch, already on the
    device, over and over (``replayed``): the ceiling a perfect data pipeline would reach.
    One warm-up step, then up to 10 measured; or, when no rank waited for data
    :data:`CEILING_FROM_WINDOW_BELOW` of its window, the window's own steps less their data
    waits (``window minus waits``; every rank decides the same: one all-reduce). That
    shortcut's ceiling is ``rate / (1 - wait)`` by construction: evidence read from it
    would be circular, so the diagnosis and the plots do not cite it."""
    span = sum(window.step_times)  # the device's own span on a GPU, as the waits are
    waited = span > 0 and sum(window.data_waits) / span >= CEILING_FROM_WINDOW_BELOW
    if not distributed.any_rank(waited):
        return [max(step - wait, 0.0) for step, wait in zip(window.step_times, window.data_waits)], WINDOW_MINUS_WAITS
    n = min(job.measured_steps, STALL_FREE_STEPS)
    probe = ProbeCore(1, n, job.ctx.device, collectives=False, monitors=False, energy_counter=False,
                      comm_profile=False)
    batches = probe.loader(itertools.repeat(job.last_batch))
    while not probe.done:
        job.extra_step(batches)
        probe.step()
    return probe.finish().step_times, REPLAYED


def profiled_comm_share(job: "TrialLoop") -> float | None:
    """GPU: exposed communication kernel time over a few profiled steps after the window,
    read as a script's probe reads its window's tail (:mod:`tuner.harness.comm_tail`: one
    step of warm-up, then :data:`~tuner.harness.comm_tail.STEPS`; events read in memory).
    ``None`` when the profiler cannot run (CUPTI missing) or saw no kernel."""
    batches = itertools.repeat(job.last_batch)
    tail = comm_tail.CommTail(job.ctx.device)
    try:
        job.extra_step(batches)
        while not tail.step():
            job.extra_step(batches)
    except TrialStop:
        raise
    except Exception:  # noqa: BLE001 - a step that failed under the profiler: no signal
        return None
    finally:
        tail.close()
    return tail.share


def count_task_flops(job: "TrialLoop") -> None:
    """FLOPs per sample, once per task and arguments in this process, unless the task says
    them: what the model itself costs, so that MFU means the same in every trial.

    Counted on a copy of the task's model built on the meta device (no memory, no time, no
    lever: one forward and backward of the last batch's shapes under FlopCounterMode).
    Counting on the trial's own model instead took whichever trial came first: a
    checkpointed one counted its recompute too (MFU about a third high in every later
    trial), a parallel-layout rank only its part (left unknown). Where the model cannot be
    built or run on the meta device (weights loaded from a file, ``.item()`` in the loss),
    the first plain trial counts it: eager, not checkpointed, the whole model on this rank.
    """
    assert job.recipe.task is not None
    task, args = job.recipe.task, job.recipe.task_args
    key = flops_key(task, args)
    if key in _FLOPS:
        return
    if task.flops_per_sample is not None:
        _FLOPS[key] = float(task.flops_per_sample(args))
        return
    batch = job.last_batch
    ops: set[str] = set()
    try:
        _FLOPS[key] = _meta_count(task, args, batch, ops) / job.config.micro_batch_size or None
        _ATTENTION[key] = uses_attention(ops)
        return
    except Exception:  # noqa: BLE001 - not meta-friendly: count on a plain trial below
        pass
    if job.engine.recompute is not None or job.config.compile or kind(job.config.engine).split:
        return  # its count would not be the model's: a later plain trial counts it

    def one_micro_batch() -> None:
        loss = job.forward(batch, True)
        job.engine.backward(loss, True)

    try:
        ops.clear()
        _FLOPS[key] = count_flops(one_micro_batch, ops) / job.config.micro_batch_size or None
        _ATTENTION[key] = uses_attention(ops)
    except TrialStop:
        raise
    except Exception:  # noqa: BLE001 - an op the counter cannot follow: no MFU, not a failed trial
        _FLOPS[key] = None


def _meta_count(task: "Task", args: dict[str, Any], batch: Any, ops: set[str] | None = None) -> float:
    """FLOPs of one forward and backward of the task's plain model on ``batch``'s shapes,
    on the meta device (``ops``: :func:`~tuner.harness.system.flops.count_flops`'s)."""
    from torch.utils._pytree import tree_map

    with torch.device("meta"):
        model = task.build_model(args)
    meta = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, batch)

    def step() -> None:
        with torch.device("meta"):  # what the loss creates without a device (positions, masks) too
            task.compute_loss(model, meta).backward()

    return count_flops(step, ops)


def task_flops(task: "Task", task_args: dict[str, Any]) -> float | None:
    """FLOPs per sample counted so far for this task and its arguments (``None``: unknown)."""
    return _FLOPS.get(flops_key(task, task_args))


def task_attention(task: "Task", task_args: dict[str, Any]) -> bool | None:
    """Whether the task's step calls scaled_dot_product_attention (``None``: no count saw it:
    the task gives its own ``flops_per_sample``, or no count has run yet)."""
    return _ATTENTION.get(flops_key(task, task_args))


def flops_key(task: "Task", task_args: dict[str, Any]) -> str:
    module = task.module
    args = json.dumps(task_args, sort_keys=True, default=str)
    return f"{getattr(module, '__file__', None) or module.__name__}:{args}"
