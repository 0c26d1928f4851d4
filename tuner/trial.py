"""One trial: build -> warm up -> measure -> tear down, with failures classified.

A trial leaves nothing behind: its loader workers are shut down, its engine destroyed,
its tensors freed and the allocator's free memory handed back to the OS, so that the
next trial in the same process measures from the same starting point.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import itertools
import json
import math
import os
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from tuner import distributed
from tuner.comm import CommTimer, exposed_share
from tuner.engines import build_engine
from tuner.errors import TrialError
from tuner.flops import count_flops, peak_flops
from tuner.metrics import Window, summarize
from tuner.monitors import GpuUtil, HostMemory
from tuner.probe import Probe

if TYPE_CHECKING:
    from tuner.distributed import DistContext
    from tuner.recipe import Recipe
    from tuner.space import Config

# Trials choose their worker counts on purpose; torch's advice against more workers than
# cores would repeat on every trial.
warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)

OK, OOM, NONFINITE, ERROR, PRUNED = "ok", "oom", "nonfinite", "error", "pruned"

STALL_FREE_STEPS = 10
"""Steps measured for the stall-free ceiling (fewer when the window itself is shorter)."""

COMM_PROFILE_STEPS = 5
"""Steps profiled after the window, on a GPU, to measure exposed communication kernels."""

PruneRule = Callable[[Window], bool]
"""Given the steps measured so far (rank 0's window), whether to stop the trial now."""


@dataclass(frozen=True)
class Instruments:
    """Optional instruments for a trial a user wants to look inside."""

    trace_dir: Path | None = None
    """Write a ``torch.profiler`` trace of the measured window here (one file per rank),
    for chrome://tracing, Perfetto or TensorBoard."""
    nvtx: bool = False
    """NVTX ranges around data wait, forward, backward and optimizer step."""


_FLOPS: dict[str, float | None] = {}
"""FLOPs per sample, counted once per task and task_args in this process."""


class _Stop(Exception):
    """Ends a trial on every rank at once, with an agreed state and reason."""

    def __init__(self, state: str, reason: str) -> None:
        super().__init__(reason)
        self.state, self.reason = state, reason


@dataclass
class TrialResult:
    """What a trial produced. ``metrics`` is ``None`` unless ``state == "ok"``."""

    params: dict[str, Any]
    state: str
    reason: str | None = None
    metrics: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds in ``build``, ``warmup``, ``measure`` and ``teardown``."""
    losses: list[float] = field(default_factory=list)
    """Rank 0's loss per optimizer step (mean of its micro-batches), warm-up included:
    what the precision guard compares with the fp32 reference."""
    notes: list[str] = field(default_factory=list)
    """What the user should know about this configuration (BatchNorm with micro-batches)."""

    @property
    def ok(self) -> bool:
        return self.state == OK

    @property
    def overhead_s(self) -> float:
        """Time outside the warm-up and measured steps: the price of a trial."""
        return self.timings.get("build", 0.0) + self.timings.get("teardown", 0.0)


def run_trial(
    recipe: "Recipe",
    config: "Config",
    ctx: "DistContext",
    prune: PruneRule | None = None,
    instruments: Instruments = Instruments(),
) -> TrialResult:
    """Train ``config`` for the recipe's warm-up and measured steps on every rank.

    Args:
        prune: asked once, on rank 0, after the first quarter of the measured steps (at
            least 3); when it says so the trial stops there as ``pruned``. Give it on
            every rank or on none: the other ranks receive rank 0's decision.
        instruments: a profiler trace of the window, NVTX ranges.
    """
    memory = HostMemory().start()
    gpu = GpuUtil(ctx.device.index if ctx.device.type == "cuda" else None).start()
    alloc_before: dict[str, int] = {}
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
        alloc_before = torch.cuda.memory_stats(ctx.device)
    timings: dict[str, float] = {}
    state, reason, window = OK, None, None
    losses: list[float] = []
    notes: list[str] = []
    t0 = time.perf_counter()
    job = _Job(recipe, config, ctx, prune, instruments)
    try:
        job.build()
        timings["build"] = time.perf_counter() - t0
        if job.batch_norm:  # said whatever happens next (a pruned trial too)
            notes.append("the model has BatchNorm layers: their statistics are per micro-batch, so the "
                         f"micro-batch size ({config.micro_batch_size}) changes what the model learns")
        memory.sample()
        window = job.run()
        timings["warmup"] = job.warmup_s
        timings["measure"] = window.wall_s
        t_ceiling = time.perf_counter()
        window.stall_free_step_times = job.stall_free()
        timings["stall_free"] = time.perf_counter() - t_ceiling
        if ctx.device.type == "cuda" and ctx.world_size > 1:
            window.comm_share = job.profiled_comm_share()
        job.count_flops()
        if job.nonfinite():
            state, reason = NONFINITE, "loss became NaN or inf during the trial"
        losses = [float(x) for x in torch.stack(job.losses).cpu()] if job.losses else []  # one sync, after
    except _Stop as stop:
        state, reason = stop.state, stop.reason
        timings.setdefault("build", time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded result
        state, reason = _classify(exc)
        timings.setdefault("build", time.perf_counter() - t0)
        # Only the reason is kept: the traceback holds the loop's frames and their tensors.
    except BaseException:  # Ctrl-C: shut the workers down before going
        job.close()
        memory.stop()
        gpu.stop()
        raise
    t_teardown = time.perf_counter()
    job.close()
    window_start = job.window_start
    del job
    peak_host = memory.stop()
    gpu.stop()
    _release_memory(ctx.device)
    timings["teardown"] = time.perf_counter() - t_teardown

    if window is not None:
        window.peak_host_bytes = peak_host
        window.gpu_util = gpu.mean(window_start, window_start + window.wall_s)
        window.gpu_mem_used_bytes = gpu.peak_used
        if ctx.device.type == "cuda":
            window.peak_device_bytes = torch.cuda.max_memory_reserved(ctx.device)
            after = torch.cuda.memory_stats(ctx.device)
            window.alloc_retries = after.get("num_alloc_retries", 0) - alloc_before.get("num_alloc_retries", 0)
            window.cuda_ooms = after.get("num_ooms", 0) - alloc_before.get("num_ooms", 0)
    # Every rank reports; a failure anywhere fails the trial everywhere.
    reports = distributed.all_gather((state, reason, window))
    failed = [(s, r) for s, r, _ in reports if s != OK]
    params = config.params()
    if failed:
        state, reason = failed[0]
        return TrialResult(params, state, reason, None, timings, losses, notes)
    windows = [w for _, _, w in reports]
    tps = recipe.task.tokens_per_sample(recipe.task_args) if recipe.task.tokens_per_sample else None
    flops = _FLOPS.get(_flops_key(recipe))
    peak = peak_flops(ctx.device, config.amp_dtype)
    return TrialResult(params, OK, None, summarize(windows, tps, flops, peak), timings, losses, notes)


class _Job:
    """The objects one trial builds, and the loop over them."""

    def __init__(
        self, recipe: "Recipe", config: "Config", ctx: "DistContext", prune: PruneRule | None, instruments: Instruments
    ) -> None:
        self.recipe, self.config, self.ctx, self.prune = recipe, config, ctx, prune
        self.instruments = instruments
        self.timer = CommTimer()
        self.losses: list[torch.Tensor] = []
        self.batch_norm = False
        self.loader: DataLoader | None = None
        self.batches: Iterator[Any] | None = None
        self.engine: Any = None
        self.bad: torch.Tensor | None = None
        self.last_batch: Any = None
        self.warmup_s = 0.0
        self.window_start = 0.0

    def build(self) -> None:
        recipe, config, ctx = self.recipe, self.config, self.ctx
        torch.manual_seed(recipe.seed)  # same initial weights on every rank and every trial
        dataset = recipe.task.build_dataset(recipe.task_args)
        self.loader = _make_loader(dataset, config, recipe, ctx)
        self.engine = build_engine(recipe.task, recipe.task_args, config, ctx.device, ctx.world_size)
        module = getattr(self.engine.model, "module", self.engine.model)
        self.batch_norm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())
        self.bad = torch.zeros((), dtype=torch.bool, device=ctx.device)

    def run(self) -> Window:
        """The measured loop. Keep it tiny: every number depends on it."""
        steps, config, engine, bad = self.recipe.steps, self.config, self.engine, self.bad
        start = time.perf_counter()
        warmup = warmup_steps(steps.warmup, config)
        probe = Probe(warmup, steps.measure, self.ctx.device, comm=self.timer, collectives=False,
                      nvtx=self.instruments.nvtx, monitors=False, script_trial=False)
        nvtx = probe.nvtx
        self.batches = _cycle(self.loader)
        batches = probe.loader(self.batches, transfer=self._transfer())
        samples = config.micro_batch_size * config.grad_accum_steps
        prune_at = max(3, steps.measure // 4) if self.prune is not None and steps.measure > 3 else None
        step_loss = torch.zeros((), device=self.ctx.device)
        with contextlib.ExitStack() as stack:
            stack.enter_context(engine.time_collectives(self.timer))
            profiler = stack.enter_context(self._trace(warmup)) if self.instruments.trace_dir else None
            while not probe.done:
                for micro in range(config.grad_accum_steps):
                    last = micro == config.grad_accum_steps - 1
                    self.last_batch = next(batches)
                    nvtx.push("forward")
                    loss = self._forward(self.last_batch, last)
                    nvtx.pop()
                    nvtx.push("backward")
                    engine.backward(loss, last)
                    nvtx.pop()
                    bad |= ~torch.isfinite(loss.detach())
                    step_loss += loss.detach().float()
                self.losses.append(step_loss / config.grad_accum_steps)  # on the device: no sync
                step_loss = torch.zeros((), device=self.ctx.device)
                nvtx.push("optimizer step")
                engine.optimizer_step()
                nvtx.pop()
                probe.step(samples)
                if profiler is not None:
                    profiler.step()
                if len(probe.window.step_times) == prune_at and probe.measuring_step and self._should_prune(probe.window):
                    raise _Stop(PRUNED, f"slower than the best so far after {prune_at} measured steps")
        probe.close()
        window = probe.finish()
        self.window_start = probe.window_start or start
        self.warmup_s = self.window_start - start
        return window

    def stall_free(self) -> list[float]:
        """Step times on the last batch, already on the device, over and over: the
        ceiling a perfect data pipeline would reach. After the window, so it costs the
        measurement nothing; one warm-up step, then up to 10 measured."""
        n = min(self.recipe.steps.measure, STALL_FREE_STEPS)
        probe = Probe(1, n, self.ctx.device, collectives=False, monitors=False, script_trial=False)
        batches = probe.loader(itertools.repeat(self.last_batch))
        while not probe.done:
            self._extra_step(batches)
            probe.step()
        return probe.finish().step_times

    def _extra_step(self, batches: Iterator[Any]) -> None:
        """One optimizer step outside the measured loop (stall-free ceiling, profiler window)."""
        accum = self.config.grad_accum_steps
        for micro in range(accum):
            loss = self._forward(next(batches), micro == accum - 1)
            self.engine.backward(loss, micro == accum - 1)
        self.engine.optimizer_step()

    def _trace(self, warmup: int) -> Any:
        """A profiler that records exactly the measured steps and writes them out."""
        from torch.profiler import ProfilerActivity, profile, schedule

        out = self.instruments.trace_dir
        assert out is not None
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"trace_rank{self.ctx.rank}.json"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.ctx.device.type == "cuda" else [])
        return profile(
            activities=activities,
            schedule=schedule(wait=max(0, warmup - 1), warmup=min(1, warmup), active=self.recipe.steps.measure, repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
        )

    def profiled_comm_share(self) -> float | None:
        """GPU: exposed communication kernel time over a few profiled steps (communication
        kernels not covered by compute kernels), after the window so the window pays no
        profiler overhead. ``None`` when the profiler cannot run (CUPTI missing)."""
        from torch.profiler import ProfilerActivity, profile

        batches = itertools.repeat(self.last_batch)
        try:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                start = time.perf_counter()
                for _ in range(COMM_PROFILE_STEPS):
                    self._extra_step(batches)
                torch.cuda.synchronize(self.ctx.device)
                wall_us = (time.perf_counter() - start) * 1e6
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "comm.json")
                prof.export_chrome_trace(path)
                with open(path) as f:
                    events = json.load(f)["traceEvents"]
        except _Stop:
            raise
        except Exception:  # noqa: BLE001 - no CUPTI, profiler already running: no signal
            return None
        return exposed_share(events, wall_us, "cuda")

    def count_flops(self) -> None:
        """FLOPs per sample, once per task in this process, unless the task says them:
        one forward and backward of the last batch under FlopCounterMode, after the window."""
        key = _flops_key(self.recipe)
        if key in _FLOPS:
            return
        task, args = self.recipe.task, self.recipe.task_args
        if task.flops_per_sample is not None:
            _FLOPS[key] = float(task.flops_per_sample(args))
            return
        batch = self.last_batch

        def one_micro_batch() -> None:
            loss = self._forward(batch, True)
            self.engine.backward(loss, True)

        try:
            _FLOPS[key] = count_flops(one_micro_batch) / self.config.micro_batch_size or None
        except _Stop:
            raise
        except Exception:  # noqa: BLE001 - an op the counter cannot follow: no MFU, not a failed trial
            _FLOPS[key] = None

    def _forward(self, batch: Any, last: bool) -> torch.Tensor:
        """Forward on every rank, then agree: if one rank failed, all stop here, before
        any of them waits in the backward's collectives for a rank that will never come."""
        loss, failure = None, None
        try:
            loss = self.engine.forward(batch, last)
        except Exception as exc:  # noqa: BLE001 - classified, agreed, then raised as _Stop
            failure = _classify(exc)
        start = time.perf_counter()
        agreed = distributed.agree(failure)
        if self.ctx.world_size > 1:
            # Blocked here is waiting for the slowest rank's forward: exposed communication
            # the job would see anyway, in its first all-reduce, were the tuner not there.
            self.timer.add(time.perf_counter() - start)
        if agreed is not None:
            raise _Stop(*agreed)
        assert loss is not None
        return loss

    def _should_prune(self, window: Window) -> bool:
        decision = self.prune(window) if self.ctx.is_main and self.prune is not None else False
        return bool(distributed.broadcast(decision))

    def nonfinite(self) -> bool:
        """Whether any rank saw a non-finite loss (one device sync, after the window)."""
        return distributed.any_rank(bool(self.bad))

    def _transfer(self) -> Any:
        if self.ctx.device.type == "cpu":
            return None
        device, non_blocking = self.ctx.device, self.config.pin_memory
        return lambda batch: _to_device(batch, device, non_blocking)

    def close(self) -> None:
        """Shut workers down and destroy the engine, whatever state the trial is in."""
        if self.batches is not None:
            self.batches.close()  # ends the loader iterator: non-persistent workers exit
        if self.loader is not None:
            iterator = getattr(self.loader, "_iterator", None)  # persistent workers live here
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
            self.loader._iterator = None
        if self.engine is not None:
            self.engine.close()
        self.loader = self.batches = self.engine = self.bad = self.last_batch = None
        self.losses = []


def _flops_key(recipe: "Recipe") -> str:
    module = recipe.task.module
    return f"{getattr(module, '__file__', None) or module.__name__}:{json.dumps(recipe.task_args, sort_keys=True, default=str)}"


def warmup_steps(warmup: int, config: "Config") -> int:
    """The recipe's warm-up, plus enough steps to drain the loader's queue once.

    All workers start together and deliver their first batches at once; with
    ``num_workers x prefetch_factor`` batches queued, a short window that starts on that
    burst reports a throughput the loader cannot sustain (seen here: 8 workers, 8 measured
    steps read 4,600 samples/s where 30 steps read 3,700).
    """
    queued = config.num_workers * config.prefetch_factor
    return warmup + math.ceil(queued / config.grad_accum_steps)


def _make_loader(dataset: Any, config: "Config", recipe: "Recipe", ctx: "DistContext") -> DataLoader:
    kwargs = config.dataloader_kwargs()
    if not isinstance(dataset, IterableDataset):
        if len(dataset) < config.micro_batch_size * ctx.world_size:
            raise TrialError(_too_small(len(dataset), config.micro_batch_size, ctx.world_size))
        if ctx.world_size > 1:
            kwargs["sampler"] = DistributedSampler(
                dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=recipe.seed, drop_last=True
            )
        else:
            kwargs["sampler"] = RandomSampler(dataset, generator=torch.Generator().manual_seed(recipe.seed))
    if recipe.task.collate is not None:
        kwargs["collate_fn"] = recipe.task.collate
    return DataLoader(dataset, drop_last=True, **kwargs)


def _cycle(loader: DataLoader) -> Iterator[Any]:
    """Batches without end: a new epoch (reshuffled) whenever one runs out."""
    epoch = 0
    while True:
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise TrialError(_too_small(None, loader.batch_size or 0, 1))
        epoch += 1


def _too_small(size: int | None, micro: int, world: int) -> str:
    have = f"{size} samples" if size is not None else "too few samples on this rank"
    return (f"the dataset yields no full micro-batch of {micro} samples per rank x {world} rank(s) "
            f"({have}); make it larger or the micro_batch_size smaller")


def _to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [_to_device(v, device, non_blocking) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def _classify(exc: BaseException) -> tuple[str, str]:
    """(state, one-line reason) for a trial's exception."""
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0][:500] if text else type(exc).__name__
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text.lower() \
            or "can't allocate memory" in text.lower():
        return OOM, first
    if isinstance(exc, TrialError):
        return ERROR, first
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return ERROR, first + where


_LIBC: Any = None


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
