"""Metric names and how a measured window becomes them (DESIGN.md, "Metrics").

Every rank measures its own :class:`Window`; :func:`summarize` turns the windows of all
ranks into one dict keyed by :data:`METRIC_NAMES`. A metric not measured in this run
(no GPU, not yet implemented) is ``None``, never a made-up number.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tuner.stats.window_length import rate_uncertainty, warm_up

GIB = 1024**3

METRIC_NAMES = (
    "step_time_p50_s", "step_time_p90_s", "step_time_p99_s", "step_time_max_s",
    "samples_per_s", "tokens_per_s", "data_wait_share", "comm_share", "gpu_util", "cpu_util",
    "peak_mem_gib", "host_mem_gib", "mfu", "stall_free_samples_per_s",
    # beyond DESIGN.md's list (README, "Departures"): evidence the diagnosis needs
    "worker_cpu_util", "transfer_share", "achieved_tflops", "gpu_mem_used_gib", "alloc_retries", "cuda_ooms",
    # the window itself: its length and how well it pins samples/s down (95% half-width, relative),
    # and the leading steps set aside as first-use warm-up (tuner.stats.window_length.warm_up)
    "measured_steps", "measured_s", "samples_per_s_ci", "warmup_set_aside",
    # the levers' own costs: compilation before the window, recompute inside it, the pipeline's idle stages
    "compile_s", "recompute_share", "bubble_share",
    # how stall_free_samples_per_s was had: "replayed" steps, or the "window minus waits"
    "stall_free_method",
    # what this process holds on its GPU (context, allocator, NCCL), what a budget is checked against
    "gpu_mem_process_gib",
    # what the allocator handed out at its peak (CUDA): reserved minus this is what it cached idle
    "peak_allocated_gib",
    # the node's GPUs (NVML) or CPU packages (powercap) over the window, per sample (DESIGN.md's)
    "energy_j_per_sample",
    # peak_mem_gib's ruler over one step on the batch of the largest samples, after the window
    "largest_batch_peak_gib",
)


def objective_value(metrics: Any, objective: str = "samples_per_s") -> float | None:
    """A run's value of ``objective``: its samples/s, or its samples per joule (the inverse of
    ``energy_j_per_sample``); ``None`` where the run did not measure it (no energy counter)."""
    if not metrics:
        return None
    if objective == "samples_per_joule":
        joules = metrics.get("energy_j_per_sample")
        return 1.0 / joules if joules else None
    return metrics.get("samples_per_s")


def median_of(values: list[Any]) -> Any:
    """The median of a metric's values over runs; for a word (``stall_free_method``), the
    most common one."""
    if all(isinstance(v, (int, float)) for v in values):
        return statistics.median(values)
    return max(dict.fromkeys(values), key=values.count)


@dataclass
class Window:
    """What one rank recorded over its measured steps."""

    step_times: list[float] = field(default_factory=list)
    """Seconds per optimizer step (host clock, or CUDA events on a GPU)."""
    data_waits: list[float] = field(default_factory=list)
    """Exposed seconds waiting for the next batch (and its copy to the device), per step:
    host time blocked on a CPU, the device's idle gap on a GPU (:mod:`tuner.harness.timing`)."""
    samples: list[int] = field(default_factory=list)
    """Samples this rank processed, per step."""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds (user + system) of the main process over the window."""
    peak_device_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    """The allocator's peak of memory handed out to tensors (CUDA's ``max_memory_allocated``):
    ``peak_device_bytes`` less this is what it held cached, unused (fragmentation,
    the allocator's settings' effect)."""
    peak_host_bytes: int | None = None
    largest_host_bytes: int | None = None
    """The process tree's peak PSS over one step on the batch of the dataset's largest samples
    (:mod:`tuner.trial.largest_batch`), after the window."""
    largest_device_bytes: int | None = None
    """The CUDA allocator's peak reserve over that step."""
    gpu_util: float | None = None
    """Mean NVML utilization over the window (0..1), ``None`` without a GPU/NVML."""
    stall_free_step_times: list[float] = field(default_factory=list)
    stall_free_method: str | None = None
    """How the stall-free steps were had: ``replayed`` or ``window minus waits``."""
    """Seconds per step re-training on one batch already on the device (no data wait)."""
    transfer_waits: list[float] | None = None
    """Seconds of each step's copies to the device as the stream ran them (part of ``data_waits``);
    ``None`` when there is no copy (CPU training)."""
    comm_waits: list[float] | None = None
    """Exposed collective seconds per step (CPU/gloo: host time blocked on collectives);
    ``None`` when not timed."""
    comm_share: float | None = None
    """Exposed share measured another way (a profiler window on GPU); wins over ``comm_waits``."""
    worker_cpu_s: float | None = None
    """CPU seconds of the loader workers (all descendants) over the window."""
    gpu_mem_used_bytes: int | None = None
    """Peak NVML "memory used" on this rank's GPU (all processes, context included)."""
    gpu_mem_process_bytes: int | None = None
    """Peak NVML memory of this rank's process on its GPU (context, allocator, NCCL)."""
    alloc_retries: int | None = None
    """cudaMalloc retries (the caching allocator freed its cache to satisfy a request:
    a near-OOM signal) during the trial."""
    cuda_ooms: int | None = None
    compile_s: float | None = None
    """Seconds the first (compiling) warm-up step took beyond a measured step; ``None``
    when nothing was compiled."""
    recompute_s: float | None = None
    """Host seconds re-running checkpointed blocks in the backward over the window (CPU,
    uncompiled); ``None`` when not timed."""
    bubble_s: float | None = None
    """Seconds of the window's pipeline steps this rank's stages sat idle (the pipeline
    bubble); ``None`` without pipeline parallelism."""
    energy_j: float | None = None
    """Joules this process's counters moved over the window (:mod:`tuner.harness.system.energy`):
    its GPU's, or its host's packages on the host's first process; ``None`` where it reads
    none."""
    energy_key: str | None = None
    """What :attr:`energy_j` counted (a GPU's UUID, ``host:NAME``): each key counts once."""
    energy_why: str | None = None
    """Why :attr:`energy_j` is ``None`` where this process should have read it."""
    gpu_util_why: str | None = None
    """Why :attr:`gpu_util` is ``None`` on a GPU NVML reads (a MIG instance, NVML refused)."""


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def window_rate(window: Window, world_size: int) -> float:
    """Samples/s over one rank's steps so far, times the ranks: the prune rule's figure,
    cheap enough to take inside the window (no gather, no device sync)."""
    return sum(window.samples) * world_size / sum(window.step_times)


def summarize(
    windows: Sequence[Window],
    tokens_per_sample: int | None = None,
    flops_per_sample: float | None = None,
    peak_flops: float | None = None,
) -> dict[str, Any]:
    """Combine the ranks' windows into the DESIGN.md metrics.

    Ranks step in lockstep, so a step takes as long as its slowest rank: step times are
    the per-step maximum over ranks. Shares and memory are the worst rank's.
    ``flops_per_sample`` (forward + backward) gives achieved FLOP/s per device, and MFU
    against ``peak_flops`` (one device's dense peak) when that is known.
    """
    n = min(len(w.step_times) for w in windows)
    every = [max(w.step_times[i] for w in windows) for i in range(n)]
    k = warm_up(every)  # a first-use plateau past the recipe's warm-up: set aside, in every figure
    steps = every[k:]
    global_samples = [sum(w.samples[i] for w in windows) for i in range(k, n)]
    mean_step = statistics.fmean(steps)
    samples_per_s = statistics.fmean(global_samples) / mean_step
    out: dict[str, Any] = dict.fromkeys(METRIC_NAMES)
    out.update(
        step_time_p50_s=percentile(steps, 50),
        step_time_p90_s=percentile(steps, 90),
        step_time_p99_s=percentile(steps, 99),
        step_time_max_s=max(steps),
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * tokens_per_sample if tokens_per_sample else None,
        data_wait_share=max(_share(sum(w.data_waits[k:n]), sum(w.step_times[k:n])) for w in windows),
        cpu_util=max(w.cpu_s / w.wall_s for w in windows if w.wall_s > 0),
        measured_steps=n - k,
        measured_s=sum(steps),
        samples_per_s_ci=rate_uncertainty(steps),
        warmup_set_aside=k,
    )
    transfers = [_share(sum(w.transfer_waits[k:n]), sum(w.step_times[k:n])) for w in windows
                 if w.transfer_waits is not None]
    out["transfer_share"] = max(transfers, default=None)
    comm = [_comm_share(w, k, n) for w in windows]
    out["comm_share"] = max((c for c in comm if c is not None), default=None)
    workers = [w.worker_cpu_s / w.wall_s for w in windows if w.worker_cpu_s is not None and w.wall_s > 0]
    out["worker_cpu_util"] = max(workers, default=None)
    if flops_per_sample:
        per_device = flops_per_sample * samples_per_s / len(windows)
        out["achieved_tflops"] = per_device / 1e12
        out["mfu"] = per_device / peak_flops if peak_flops else None
    used = [w.gpu_mem_used_bytes for w in windows if w.gpu_mem_used_bytes is not None]
    out["gpu_mem_used_gib"] = max(used) / GIB if used else None
    own = [w.gpu_mem_process_bytes for w in windows if w.gpu_mem_process_bytes is not None]
    out["gpu_mem_process_gib"] = max(own) / GIB if own else None
    for name in ("alloc_retries", "cuda_ooms"):
        counts = [getattr(w, name) for w in windows if getattr(w, name) is not None]
        out[name] = sum(counts) if counts else None
    compiles = [w.compile_s for w in windows if w.compile_s is not None]
    out["compile_s"] = max(compiles, default=None)
    recomputes = [_share(w.recompute_s, w.wall_s) for w in windows if w.recompute_s is not None]
    out["recompute_share"] = max(recomputes, default=None)
    bubbles = [_share(w.bubble_s, w.wall_s) for w in windows if w.bubble_s is not None]
    out["bubble_share"] = max(bubbles, default=None)
    utils = [w.gpu_util for w in windows if w.gpu_util is not None]
    out["gpu_util"] = statistics.fmean(utils) if utils else None
    k = min(len(w.stall_free_step_times) for w in windows)
    if k:
        ceiling_step = statistics.fmean(max(w.stall_free_step_times[i] for w in windows) for i in range(k))
        out["stall_free_samples_per_s"] = statistics.fmean(global_samples) / ceiling_step
        methods = {w.stall_free_method for w in windows}
        out["stall_free_method"] = "replayed" if "replayed" in methods else next(iter(methods))
    hosts = [w.peak_host_bytes for w in windows if w.peak_host_bytes is not None]
    devices = [w.peak_device_bytes for w in windows if w.peak_device_bytes is not None]
    host_gib = max(hosts) / GIB if hosts else None
    out["host_mem_gib"] = host_gib
    # On a CPU-only machine the host is the device: its PSS is what runs out.
    out["peak_mem_gib"] = max(devices) / GIB if devices else host_gib
    largest = [w.largest_device_bytes for w in windows if w.largest_device_bytes is not None] or \
        [w.largest_host_bytes for w in windows if w.largest_host_bytes is not None]  # peak_mem_gib's ruler
    out["largest_batch_peak_gib"] = max(largest) / GIB if largest else None
    allocated = [w.peak_allocated_bytes for w in windows if w.peak_allocated_bytes is not None]
    out["peak_allocated_gib"] = max(allocated) / GIB if allocated else None
    out["energy_j_per_sample"] = energy_per_sample(windows)
    return out


def budget_peak(metrics: Mapping[str, Any]) -> float | None:
    """The peak the memory budget holds at: the batch of the largest samples' where it was
    stepped (:mod:`tuner.trial.largest_batch`), else the window's (``peak_mem_gib``)."""
    peaks = [metrics.get(k) for k in ("peak_mem_gib", "largest_batch_peak_gib") if metrics.get(k) is not None]
    return max(peaks) if peaks else None


def energy_per_sample(windows: Sequence[Window]) -> float | None:
    """The job's joules over every sample of the windows: each counter key once (ranks that
    share a GPU read the same counter), so only the job's own GPUs count. The counters span
    the whole window, its set-aside warm-up too, so every step's samples count. ``None``
    where no process read a counter or one that should have could not (a part of the job's
    GPUs is not its energy), never 0."""
    if any(w.energy_why for w in windows):
        return None
    joules: dict[str | None, float] = {}
    for w in windows:  # the first rank's reading of a counter several read
        if w.energy_j is not None:
            joules.setdefault(w.energy_key, w.energy_j)
    samples = sum(sum(w.samples) for w in windows)
    return sum(joules.values()) / samples if joules and samples else None


def unmeasured(windows: Sequence[Window]) -> dict[str, str]:
    """Why each figure a GPU or host could not give is missing (energy, and NVML's utilisation
    on a GPU it reads only in part), by metric name: never a silent null."""
    out = {}
    if energy_per_sample(windows) is None:
        out["energy_j_per_sample"] = next((w.energy_why for w in windows if w.energy_why),
                                          "no process read an energy counter")
    util = next((w.gpu_util_why for w in windows if w.gpu_util_why), None)
    if util and all(w.gpu_util is None for w in windows):
        out["gpu_util"] = util
    return out


def _comm_share(w: Window, k: int, n: int) -> float | None:
    if w.comm_share is not None:
        return w.comm_share
    if w.comm_waits is None:
        return None
    whole = sum(w.step_times[k:n]) if k else w.wall_s
    return _share(sum(w.comm_waits[k:n]), whole)


def _share(part: float, whole: float) -> float:
    return min(1.0, part / whole) if whole > 0 else 0.0


def live_figures(recent: list[tuple[float, float, int]], steps: int, samples: int, wait_s: float) -> dict[str, float]:
    """The live endpoint's figures: over ``recent`` steps (step seconds, data-wait seconds,
    samples; a copy the loop no longer appends to), and the probe's totals. Host clock, no
    device synchronisation."""
    times = [s for s, _, _ in recent]
    busy = sum(times)
    return {
        "steps": float(steps),
        "samples": float(samples),
        "data_wait_seconds": wait_s,
        "step_time_p50_s": percentile(times, 50) if times else 0.0,
        "step_time_p90_s": percentile(times, 90) if times else 0.0,
        "samples_per_s": sum(n for _, _, n in recent) / busy if busy > 0 else 0.0,
        "data_wait_share": min(1.0, sum(w for _, w, _ in recent) / busy) if busy > 0 else 0.0,
    }
