"""The batch of the dataset's largest samples, and its peak memory.

A window's batches are typical ones: where the loader pads each batch to its longest
sample, the batch of the longest samples costs more than any the window saw, and a job
within the budget for its window runs out of memory later in its epoch. :func:`scan` reads
the samples' sizes once (the task's ``sample_size``, else the elements of each sample's
tensors, arrays, number lists and strings), in loader workers where the recipe has them;
:func:`step` trains one optimizer step on the micro-batch of the largest, after the
window and outside its time, and reads its peak with the tuner's own rulers (the process
tree's PSS, the CUDA allocator's reserve).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

from tuner.harness import distributed
from tuner.harness.system.monitors import HostMemory
from tuner.inputs.errors import RecipeError
from tuner.trial.data import quiet_worker_advice, to_device
from tuner.trial.failures import TrialStop, classify
from tuner.trial.trial_result import State

if TYPE_CHECKING:
    from tuner.harness.metrics import Window
    from tuner.inputs.recipe import Recipe
    from tuner.inputs.task import Task
    from tuner.trial.loop import TrialLoop

LIMIT = 20_000
"""Samples read at most: a larger or an iterable dataset is read this far (the line says so)."""
SECONDS = 15.0
"""About how long the scan reads for at most (a slow store's samples: the line says how many)."""
CHUNK = 256
"""Samples a loader worker sizes at a time."""


@dataclasses.dataclass(frozen=True)
class Scan:
    """What the scan found: the largest samples, largest first, and how it read them."""

    largest: list[tuple[int, Any]]
    """(size, the sample's index in a map-style dataset or the sample itself in an iterable
    one), at most the global batch of them."""
    smallest: int
    read: int
    complete: bool
    """Every sample was read."""
    seconds: float
    measure: str
    """How a sample's size was read (``sample_size``, or its ``elements``)."""
    why: str | None = None
    """Why nothing was scanned (the dataset could not be read here)."""
    peaks: dict[Any, tuple[int | None, int | None]] = dataclasses.field(default_factory=dict, compare=False)
    """Each configuration's (host, device) peak at the largest batch in this process: it is
    stepped once, its repeats and the finish's runs read it here."""

    @property
    def varies(self) -> bool:
        """Some batch costs more than another: there is a largest batch to check."""
        return bool(self.largest) and self.largest[0][0] > self.smallest

    def line(self) -> str:
        """What the scan read, in one line."""
        if self.why is not None:
            return f"largest batch: not checked: {self.why}"
        read = f"{self.read:,} samples read" + ("" if self.complete else " (the dataset's first)")
        if not self.varies:
            return (f"largest batch: {read} in {self.seconds:.2f} s, all of size {self.smallest}: every batch "
                    "costs the same")
        return (f"largest batch: {read} in {self.seconds:.2f} s, sizes {self.smallest} to {self.largest[0][0]} "
                f"({self.measure}): the memory budget holds at the batch of the largest")

    def samples(self, dataset: Any, k: int) -> list[Any]:
        """The ``k`` largest samples (read again from a map-style dataset)."""
        kept = [ref for _, ref in self.largest[:k]]
        return kept if isinstance(dataset, IterableDataset) else [dataset[i] for i in kept]


def default_size(sample: Any) -> int:
    """The elements of a sample's tensors and arrays, the numbers of its lists, the
    characters of its strings."""
    if isinstance(sample, torch.Tensor):
        return sample.numel()
    if isinstance(sample, (str, bytes)):
        return len(sample)
    if isinstance(sample, dict):
        return sum(default_size(v) for v in sample.values())
    if isinstance(sample, (list, tuple)):
        return sum(default_size(v) for v in sample)
    size = getattr(sample, "size", None)  # a numpy array
    if isinstance(size, int) and hasattr(sample, "shape"):
        return size
    return 1 if isinstance(sample, (int, float, bool)) else 0


def _sizes(measure: Callable[[Any], Any], samples: list[Any]) -> list[Any]:
    """Each sample's size, or what went wrong with it (said by :func:`_checked` in the
    main process: a worker's exception would arrive wrapped in its traceback)."""
    out: list[Any] = []
    for sample in samples:
        try:
            out.append(measure(sample))
        except Exception as exc:  # noqa: BLE001 - the user's function: its failure is an input error
            out.append(_Raised(f"{type(exc).__name__}: {exc}"))
    return out


class _Raised(str):
    """What ``sample_size`` raised on a sample (a string: it crosses from a worker as one)."""


def _checked(size: Any, position: int) -> int:
    if isinstance(size, _Raised):
        raise RecipeError(f"task: sample_size raised {size} on sample {position}; "
                          "fix it, or remove it to size samples by their tensors' elements")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise RecipeError(f"task: sample_size returned {size!r} ({type(size).__name__}) for sample {position}; "
                          "it must return an integer >= 0")
    return size


def scan(task: "Task", task_args: dict[str, Any], keep: int, workers: int = 0, limit: int = LIMIT,
         seconds: float = SECONDS) -> Scan:
    """:func:`scan_dataset` of the task's dataset, by its ``sample_size`` where it has one; a
    dataset that cannot be built here gets a scan that says why."""
    start = time.perf_counter()
    try:
        dataset = task.build_dataset(task_args)
    except Exception as exc:  # noqa: BLE001 - the task's data fails its trials too, where it is said
        return Scan([], 0, 0, False, time.perf_counter() - start, "", _raised("building", exc))
    return scan_dataset(dataset, task.sample_size, keep, workers, limit, seconds)


def scan_dataset(dataset: Any, sample_size: Callable[[Any], Any] | None, keep: int, workers: int = 0,
                 limit: int = LIMIT, seconds: float = SECONDS) -> Scan:
    """The ``keep`` largest of the dataset's samples read in order, at most ``limit`` of them
    and for about ``seconds``, sized by ``sample_size`` (else :func:`default_size`) in
    ``workers`` loader workers (a map-style dataset's). A dataset that cannot be read here
    gets a scan that says why; a ``sample_size`` that fails is a :class:`RecipeError`."""
    start = time.perf_counter()
    measure = sample_size or default_size
    largest: list[tuple[int, int, Any]] = []  # a min-heap of (size, -position, reference)
    smallest, read, complete, chunks = None, 0, False, None
    try:
        iterable = isinstance(dataset, IterableDataset)
        n = limit if iterable else min(len(dataset), limit)
        if iterable:
            chunks = ((c, _sizes(measure, c)) for c in _batched(itertools.islice(iter(dataset), n)))
        else:
            quiet_worker_advice()  # the space's worker count, chosen on purpose
            chunks = iter(DataLoader(dataset, batch_size=CHUNK, sampler=range(n), num_workers=workers,
                                     collate_fn=lambda c: (None, _sizes(measure, c))))
        for samples, sizes in chunks:
            for i, raw in enumerate(sizes):
                size = _checked(raw, read + i) if sample_size else raw
                smallest = size if smallest is None else min(smallest, size)
                entry = (size, -(read + i), samples[i] if iterable else read + i)
                if len(largest) < keep:
                    heapq.heappush(largest, entry)
                elif size > largest[0][0]:
                    heapq.heapreplace(largest, entry)
            read += len(sizes)
            if time.perf_counter() - start > seconds:
                break
        complete = not iterable and read == len(dataset)
    except RecipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the data fails its trials too, where it is said
        return Scan([], 0, read, False, time.perf_counter() - start, "", _raised("reading", exc))
    finally:  # the loader's workers end here, however the scan ends (its error holds this frame)
        getattr(chunks, "_shutdown_workers", lambda: None)()
    ranked = [(size, ref) for size, _, ref in sorted(largest, key=lambda e: (-e[0], -e[1]))]
    measured = "sample_size" if sample_size else "elements"
    return Scan(ranked, smallest or 0, read, complete, time.perf_counter() - start, measured)


def scan_kept(dataset: Any, keep: int, workers: int, path: Path) -> Scan:
    """:func:`scan_dataset` by the default size, read once for the trials of one run: a
    map-style dataset's scan is kept in ``path``, where a later trial of a dataset of the
    same length reads it (each script trial is a process of its own)."""
    iterable = isinstance(dataset, IterableDataset)
    kept = ("largest", "smallest", "read", "complete", "seconds", "measure")  # what a Scan says, no samples
    try:
        data = json.loads(path.read_text()) if not iterable else None
        if data is not None and data["length"] == len(dataset) and data["keep"] >= keep:
            return Scan(**{**{k: data[k] for k in kept}, "largest": [tuple(e) for e in data["largest"]]})
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not there yet, or another run's: read it again
    found = scan_dataset(dataset, None, keep, workers)
    if not iterable and found.why is None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"length": len(dataset), "keep": keep, **{k: getattr(found, k) for k in kept}}))
        os.replace(tmp, path)
    return found


def _raised(doing: str, exc: Exception) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{doing} the dataset raised {type(exc).__name__}: {first}"


def _batched(samples: Iterable[Any]) -> Iterator[list[Any]]:
    it = iter(samples)
    while chunk := list(itertools.islice(it, CHUNK)):
        yield chunk


_SCANS: dict[tuple[Any, ...], Scan] = {}


def scan_once(recipe: "Recipe") -> Scan | None:
    """The recipe's scan, read once a process, by rank 0 for every rank (``None``:
    ``budget.largest_batch: false``, or a script recipe, whose dataset the tuner does not hold)."""
    if not recipe.budget.largest_batch or recipe.task is None:
        return None
    workers = max(recipe.space.get("num_workers", (0,)) + (recipe.baseline.get("num_workers", 0),))
    key = (recipe.task.module.__name__, repr(recipe.task_args), recipe.global_batch_size)
    if key not in _SCANS:  # rank 0 reads, every rank is told (a collective: every rank calls this)
        outcome: Scan | RecipeError | None = None
        if distributed.is_main_process():
            try:
                outcome = scan(recipe.task, recipe.task_args, recipe.global_batch_size, workers)
            except RecipeError as exc:
                outcome = exc
        outcome = distributed.broadcast(outcome)
        if isinstance(outcome, RecipeError):
            raise RecipeError(str(outcome))
        _SCANS[key] = outcome
    return _SCANS[key]


def peak_of(run: Callable[[], None], device: torch.device, window: "Window") -> None:
    """Run ``run`` (one optimizer step on the batch of the largest samples, after the window)
    and set its peaks on ``window``: the process tree's PSS, and on a GPU the allocator's
    reserve (its counter reset first: the window's own peak was read at its close)."""
    host = HostMemory(exact_peak=True).start()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        run()
    finally:
        peak = host.stop()
    window.largest_host_bytes = peak
    if device.type == "cuda":
        window.largest_device_bytes = torch.cuda.max_memory_reserved(device)


def step(job: "TrialLoop", found: Scan, window: "Window", timings: dict[str, float]) -> tuple[str, str | None]:
    """One optimizer step on the micro-batch of the largest samples (its seconds in
    ``timings["largest_batch"]``), its peaks set on ``window``, or the peaks this process took
    for the configuration before; returns the trial's state after it (``ok``, or how the step
    failed)."""
    config, device = job.config, job.ctx.device
    if config in found.peaks:
        window.largest_host_bytes, window.largest_device_bytes = found.peaks[config]
        return State.OK, None
    assert job.loader is not None and job.recipe.task is not None
    start = time.perf_counter()
    samples = found.samples(job.loader.dataset, config.micro_batch_size)
    collate = job.recipe.task.collate or default_collate
    batch = to_device(collate(samples), device, False, config.channels_last)
    try:
        peak_of(lambda: job.extra_step(itertools.repeat(batch)), device, window)
    except TrialStop as stop:
        state, reason = stop.state, stop.reason
    except Exception as exc:  # noqa: BLE001 - a failure at the largest batch is the configuration's
        state, reason = classify(exc)
    else:
        found.peaks[config] = (window.largest_host_bytes, window.largest_device_bytes)
        return State.OK, None
    finally:
        timings["largest_batch"] = time.perf_counter() - start
    return state, f"{reason} (one step on the batch of the largest samples, after the window)"
