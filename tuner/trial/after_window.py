"""Steps outside the measured window, each after it so the window pays nothing for them:
the stall-free ceiling, the GPU profiler window for exposed communication, the FLOP count."""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Any

import torch

from tuner.harness import distributed
from tuner.harness.comm import exposed_share, trace_events
from tuner.harness.probe_core import ProbeCore
from tuner.harness.system.flops import count_flops
from tuner.trial.failures import TrialStop

if TYPE_CHECKING:
    from tuner.config.task import Task
    from tuner.harness.metrics import Window
    from tuner.trial.loop import Job

STALL_FREE_STEPS = 10
"""Steps measured for the stall-free ceiling (fewer when the window itself is shorter)."""
CEILING_FROM_WINDOW_BELOW = 0.05
"""A window that waited for data less than this share of its time (on every rank) takes
its stall-free ceiling from its own steps less their waits, instead of ten more steps: the
ceiling is then at most 1/0.95 of the measured rate, too close for any verdict to turn on
(data-bound needs a 10% wait), and on the benchmark's DeepSpeed job (a 4% wait) the extra
steps were 0.4-0.6 s of a 3 s trial."""

COMM_PROFILE_STEPS = 5
"""Steps profiled after the window, on a GPU, to measure exposed communication kernels."""

_FLOPS: dict[str, float | None] = {}
"""FLOPs per sample, counted once per task and task_args in this process."""


REPLAYED, WINDOW_MINUS_WAITS = "replayed", "window minus waits"
"""The values of the ``stall_free_method`` metric."""


def stall_free(job: "Job", window: "Window") -> tuple[list[float], str]:
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
    probe = ProbeCore(1, n, job.ctx.device, collectives=False, monitors=False)
    batches = probe.loader(itertools.repeat(job.last_batch))
    while not probe.done:
        job.extra_step(batches)
        probe.step()
    return probe.finish().step_times, REPLAYED


def profiled_comm_share(job: "Job") -> float | None:
    """GPU: exposed communication kernel time over a few profiled steps (communication
    kernels not covered by compute kernels), over the span the device was running them.

    The first profiled step is the profiler's warm-up: ranks start profiling at different
    moments, and a rank that starts early sees its first collective wait for the others
    (skew, not communication). The events are read in memory: exporting a Chrome trace and
    parsing it back cost seconds per rank on large models. ``None`` when the profiler cannot
    run (CUPTI missing) or saw no kernel."""
    from torch.profiler import ProfilerActivity, profile, schedule

    batches = itertools.repeat(job.last_batch)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=0, warmup=1, active=COMM_PROFILE_STEPS)) as prof:
            for _ in range(1 + COMM_PROFILE_STEPS):
                job.extra_step(batches)
                prof.step()
            torch.cuda.synchronize(job.ctx.device)
        events = trace_events(prof)
    except TrialStop:
        raise
    except Exception:  # noqa: BLE001 - no CUPTI, profiler already running: no signal
        return None
    kernels = [e for e in events if e["cat"] == "kernel"]
    if not kernels:
        return None
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    return exposed_share(events, span, "cuda")


def count_task_flops(job: "Job") -> None:
    """FLOPs per sample, once per task in this process, unless the task says them: one
    forward and backward of the last batch under FlopCounterMode."""
    assert job.recipe.task is not None
    key = flops_key(job.recipe.task, job.recipe.task_args)
    if key in _FLOPS or job.config.engine == "layout":  # a model-parallel rank runs a part: counted elsewhere
        return
    task, args = job.recipe.task, job.recipe.task_args
    assert task is not None
    if task.flops_per_sample is not None:
        _FLOPS[key] = float(task.flops_per_sample(args))
        return
    batch = job.last_batch

    def one_micro_batch() -> None:
        loss = job.forward(batch, True)
        job.engine.backward(loss, True)

    try:
        _FLOPS[key] = count_flops(one_micro_batch) / job.config.micro_batch_size or None
    except TrialStop:
        raise
    except Exception:  # noqa: BLE001 - an op the counter cannot follow: no MFU, not a failed trial
        _FLOPS[key] = None


def task_flops(task: "Task", task_args: dict[str, Any]) -> float | None:
    """FLOPs per sample counted so far for this task and its arguments (``None``: unknown)."""
    return _FLOPS.get(flops_key(task, task_args))


def flops_key(task: "Task", task_args: dict[str, Any]) -> str:
    module = task.module
    args = json.dumps(task_args, sort_keys=True, default=str)
    return f"{getattr(module, '__file__', None) or module.__name__}:{args}"
