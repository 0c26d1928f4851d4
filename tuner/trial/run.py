"""One trial: build -> warm up -> measure -> steps after the window -> tear down, with
failures classified and agreed by every rank.

A trial leaves nothing behind: its loader workers are shut down, its engine destroyed,
its tensors freed and the allocator's free memory handed back to the OS, so that the
next trial in the same process measures from the same starting point.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from tuner.harness import distributed
from tuner.harness.comm import on_device
from tuner.harness.metrics import Window, summarize, unmeasured
from tuner.harness.system.environment import rank_threads
from tuner.harness.system.flops import peak_flops, tf32_in_use
from tuner.harness.system.monitors import GpuUtil, HostMemory
from tuner.inputs.levers.precision import matmul_dtype
from tuner.trial import ceiling_comm_flops as after
from tuner.trial import largest_batch, watchdog
from tuner.trial.data import quiet_worker_advice
from tuner.trial.engines import process
from tuner.trial.failures import TrialStop, classify, poisons
from tuner.trial.loop import TrialLoop
from tuner.trial.trial_result import Instruments, PruneRule, State, TrialResult

if TYPE_CHECKING:
    from tuner.harness.distributed import DistContext
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Recipe
    from tuner.inputs.task import Task


def run_trial(
    recipe: "Recipe",
    config: "Plan",
    ctx: "DistContext",
    prune: PruneRule | None = None,
    instruments: Instruments = Instruments(),
    on_hang: Callable[[str], None] | None = None,
) -> TrialResult:
    """Train ``config`` for the recipe's warm-up and measured steps on every rank.

    Args:
        prune: asked once, on rank 0, after the first quarter of the measured steps (at
            least 3); when it says so the trial stops there as ``pruned``. Give it on
            every rank or on none: the other ranks receive rank 0's decision.
        instruments: a profiler trace of the window, NVTX ranges.
        on_hang: rank 0 records the trial ``hung`` with it, past the trial's time limit,
            before the process ends (:mod:`tuner.trial.watchdog`).

    The process-wide levers (TF32 matmuls, cuDNN's algorithm search) hold from the build to
    the metrics (the MFU peak reads them), then the process's own settings come back.
    """
    with process.held(config):
        return _run(recipe, config, ctx, prune, instruments, on_hang)


def _run(recipe: "Recipe", config: "Plan", ctx: "DistContext", prune: PruneRule | None,
         instruments: Instruments, on_hang: Callable[[str], None] | None) -> TrialResult:
    freeze_once()
    quiet_worker_advice()
    memory = HostMemory(exact_peak=True).start()
    dog = watchdog.start(recipe.path, recipe.steps, config, ctx, on_hang)
    gpu = GpuUtil(ctx.device.index if ctx.device.type == "cuda" else None).start()
    alloc_before = _allocator_start(ctx.device)
    timings: dict[str, float] = {}
    state, reason, window, pruned_at = State.OK, None, None, None
    losses: list[float] = []
    notes: list[str] = []
    t0 = time.perf_counter()
    job = TrialLoop(recipe, config, ctx, prune, instruments)
    try:
        job.build()
        timings["build"] = time.perf_counter() - t0
        notes = job.engine.notes  # what it says during the steps too (a loss that falls back)
        memory.sample()
        window = _measure(job, timings)
        if job.nonfinite():
            state, reason = State.NONFINITE, "loss became NaN or inf during the trial"
        losses = job.read_losses()
    except TrialStop as stop:
        state, reason, pruned_at = stop.state, stop.reason, stop.pruned_at
        if state == State.PRUNED:  # cut short, its curve so far still goes to the precision guard
            losses = job.read_losses()
        timings.setdefault("build", time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded result
        state, reason = classify(exc)
        timings.setdefault("build", time.perf_counter() - t0)
        # Only the reason is kept: the traceback holds the loop's frames and their tensors.
    except BaseException:  # Ctrl-C: shut the workers down before going
        dog.stop()
        job.close()
        memory.stop()
        gpu.stop()
        raise
    memory.sample()  # the loader workers, still alive: a trial shorter than one tick sees them here
    peak_host = memory.stop()  # the window's: the largest batch's step is measured apart
    gpu.stop()
    window_start, convolutions, batch_norm = job.window_start, job.convolutions, job.batch_norm
    t_teardown = time.perf_counter()
    try:
        if window is not None:
            _allocator_end(window, ctx.device, alloc_before)
            state, reason = _largest_batch(job, window, state, reason, timings)
        job.close()
        del job
        _release_memory(ctx.device)
    except Exception as exc:  # noqa: BLE001 - a CUDA error is asynchronous: it can surface only here
        state, reason, window = *_teardown_failure(state, reason, exc), None
    timings["teardown"] = time.perf_counter() - t_teardown - timings.get("largest_batch", 0.0)
    if window is not None:
        window.peak_host_bytes = peak_host
        window.gpu_util = gpu.mean(window_start, window_start + window.wall_s)
        window.gpu_mem_used_bytes, window.gpu_mem_process_bytes = gpu.peak_used, gpu.peak_own
    assert recipe.task is not None
    trial = TrialResult.of(config, state, reason, timings=timings, losses=losses, notes=notes, pruned_at=pruned_at,
                           batch_norm=batch_norm)  # a pruned trial's too
    result = _agree(recipe.task, recipe.task_args, config, ctx, trial, window, convolutions)
    if result.state == State.OK:  # a model that was built: what it is made of
        result.ran["model"] = model_facts(recipe.task, recipe.task_args, convolutions)
        result.ran["threads"] = rank_threads(ctx.world_size)  # under the trial's own intra_op_threads
    result.restart = poisons(result.state, result.reason, config.engine, ctx.world_size, ctx.device.type == "cuda")
    watchdog.learn(recipe.path, recipe.steps, recipe.global_batch_size, config, dog.stop(), result)
    return result


def model_facts(task: "Task", task_args: dict[str, Any], convolutions: bool) -> dict[str, bool]:
    """What the model is made of, for advice only some models can take (channels_last and
    cuDNN's algorithm search act on convolutions, an attention kernel on
    scaled_dot_product_attention): ``attention`` only where a FLOP count saw the step's calls."""
    facts = {"convolutions": convolutions}
    attention = after.task_attention(task, task_args)
    if attention is not None:
        facts["attention"] = attention
    return facts


def _largest_batch(job: TrialLoop, window: Window, state: str, reason: str | None,
                   timings: dict[str, float]) -> tuple[str, str | None]:
    """A measured trial's step on the batch of the largest samples, where batches differ."""
    found = largest_batch.scan_once(job.recipe)
    if state != State.OK or found is None or not found.varies:
        return state, reason
    return largest_batch.step(job, found, window, timings)


def _teardown_failure(state: str, reason: str | None, exc: Exception) -> tuple[str, str | None]:
    """The trial's state and reason once its teardown raised: the teardown's failure, or
    the first failure's with the teardown's after it."""
    if state == State.OK:
        return classify(exc)
    return state, f"{reason}; then {classify(exc)[1]}"


def _measure(job: TrialLoop, timings: dict[str, float]) -> Window:
    """The measured window, then the steps that come after it."""
    window = job.run()
    timings["warmup"] = job.warmup_s
    timings["measure"] = window.wall_s
    t_ceiling = time.perf_counter()
    window.stall_free_step_times, window.stall_free_method = after.stall_free(job, window)
    timings["stall_free"] = time.perf_counter() - t_ceiling
    if job.ctx.world_size > 1 and on_device(job.ctx.device):  # NCCL: a trace; gloo: the host's timer
        window.comm_share = after.profiled_comm_share(job)
    after.count_task_flops(job)
    return window


def _agree(task: "Task", task_args: dict[str, Any], config: "Plan", ctx: "DistContext", result: TrialResult,
           window: Window | None, convolutions: bool = False) -> TrialResult:
    """Every rank reports; a failure anywhere fails the trial everywhere; the windows of
    all ranks become the metrics (the ``task``'s tokens and FLOPs per sample with them)."""
    reports = distributed.all_gather((result.state, result.reason, window))
    failed = [(s, r) for s, r, _ in reports if s != State.OK]
    if failed:
        result.state, result.reason = failed[0]
        return result
    tps = task.tokens_per_sample(task_args) if task.tokens_per_sample else None
    peak = peak_flops(ctx.device, matmul_dtype(config), convolutions)
    if peak is not None and config.amp_dtype == "fp32" and tf32_in_use(convolutions):
        result.notes.append("fp32 matmuls or convolutions run in TF32 on this GPU: MFU is against the TF32 peak")
    windows = [w for _, _, w in reports]
    result.metrics = summarize(windows, tps, after.task_flops(task, task_args), peak)
    result.unmeasured.update(unmeasured(windows))
    return result


def _allocator_start(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {}
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_stats(device)


def _allocator_end(window: Window, device: torch.device, before: dict[str, Any]) -> None:
    """Peak reserved memory and the allocator's retries and OOMs over the trial (CUDA)."""
    if device.type != "cuda":
        return
    window.peak_device_bytes = torch.cuda.max_memory_reserved(device)
    window.peak_allocated_bytes = torch.cuda.max_memory_allocated(device)
    now = torch.cuda.memory_stats(device)
    window.alloc_retries = now.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0)
    window.cuda_ooms = now.get("num_ooms", 0) - before.get("num_ooms", 0)


_LIBC: Any = None
_FROZEN = False
_OWN = False
"""Set by the command lines (:func:`own_process`)."""


def own_process() -> None:
    """This process is the tuner's own command line: :func:`freeze` may freeze its heap (in a
    user's process, where ``tuner.measure()`` is a library call, it never does), and a hung
    trial ends it (a library call raises instead: :mod:`tuner.trial.watchdog`)."""
    global _OWN
    _OWN = True
    watchdog.command_line()
    _show_each_warning_once()


def _show_each_warning_once() -> None:
    """A warning once, not once a step. DeepSpeed's CPU accelerator starts a subprocess in
    every ZeRO-3 gradient reduce, and each enters ``warnings.catch_warnings``, which clears
    the registries that show a warning once per place ("once" filters' too). What is shown is
    remembered here instead. A user's ``-W`` / ``PYTHONWARNINGS`` (``"always"`` among them)
    decides alone."""
    if sys.warnoptions:
        return
    shown: set[tuple[str, type, str, int]] = set()
    show = warnings.showwarning

    def once(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        key = (str(message), category, filename, lineno)
        if key not in shown:
            shown.add(key)
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = once


@contextlib.contextmanager
def frozen_for_the_call() -> Iterator[None]:
    """Inside a library call (``tuner.measure()`` in a user's process): :func:`freeze` may
    freeze the heap for the call's trials, and it is unfrozen on the way out, so the caller's
    collector is as it was and a trial's collections do not scan the caller's heap. A caller
    that froze objects of its own keeps them frozen: then nothing is frozen or unfrozen here.
    """
    global _OWN, _FROZEN
    if _OWN or gc.get_freeze_count():
        yield
        return
    _OWN = True
    try:
        yield
    finally:
        _OWN = False
        if _FROZEN:
            gc.unfreeze()
            _FROZEN = False


def freeze_once() -> None:
    """Before the process's first trial, :func:`freeze` (a process that called it already,
    the search around its one-time setup, is left as it is)."""
    if not _FROZEN:
        freeze()


def freeze() -> None:
    """Move what is alive now (torch, DeepSpeed, Optuna, SQLAlchemy: ~225k objects) out of
    the garbage collector's sight with ``gc.freeze``.

    Each trial collects twice (the engine's release and :func:`_release_memory`), and a full
    collection with those modules loaded scans objects that live as long as the process.
    Frozen, a collection scans only what trials created. What is frozen is never collected,
    so only objects alive before any trial are frozen: the search calls this before its
    one-time DeepSpeed and compiler setup (whose throw-away engines collect too) and again
    after it, since the modules DeepSpeed imports lazily come then."""
    global _FROZEN
    if not _OWN:
        return
    gc.collect()
    gc.freeze()
    _FROZEN = True


def _release_memory(device: torch.device) -> None:
    """Free what the trial left to the garbage collector, then give it back to the OS.

    glibc keeps freed heap pages in the process; without ``malloc_trim`` a trial that
    peaked high makes every later trial on CPU look as large.
    """
    global _LIBC
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        _LIBC = ctypes.CDLL(name) if name else False
    if _LIBC and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
