"""The trial's data: its DataLoader from the config's knobs, batches without end, and the
copy to the device."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from tuner.inputs.errors import TrialError
from tuner.inputs.levers import dataloader_kwargs

if TYPE_CHECKING:
    from tuner.harness.distributed import DistContext
    from tuner.inputs.plan import Plan



def quiet_worker_advice() -> None:
    """Trials choose their worker counts on purpose; torch's advice against more workers
    than cores would repeat on every trial. (A filter, set per trial: a library call puts
    the caller's filters back afterwards, :mod:`tuner.harness.caller_state`.)"""
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)


def warmup_steps(warmup: int, config: "Plan") -> int:
    """The recipe's warm-up, plus enough steps to drain the loader's queue once.

    All workers start together and deliver their first batches at once; with
    ``num_workers x prefetch_factor`` batches queued, a short window that starts on that
    burst reports a throughput the loader cannot sustain.
    """
    queued = config.num_workers * config.prefetch_factor
    return warmup + math.ceil(queued / config.grad_accum_steps)


def make_loader(dataset: Any, config: "Plan", ctx: "DistContext", seed: int,
                collate: Callable[[list[Any]], Any] | None = None) -> DataLoader:
    """The config's DataLoader: a sampler seeded with the recipe's ``seed`` (distributed over
    the data-parallel ranks: those of one tensor/pipeline-parallel model copy read the same
    samples), the task's ``collate`` function, full micro-batches only."""
    kwargs = dataloader_kwargs(config)
    lay = config.layout  # the ranks of one model copy read the same samples
    if not isinstance(dataset, IterableDataset):
        if len(dataset) < config.micro_batch_size * lay.dp:
            raise TrialError(_too_small(len(dataset), config.micro_batch_size, lay.dp))
        if lay.dp > 1:
            kwargs["sampler"] = DistributedSampler(
                dataset, num_replicas=lay.dp, rank=lay.data_rank(ctx.rank), shuffle=True, seed=seed, drop_last=True
            )
        else:
            kwargs["sampler"] = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    if collate is not None:
        kwargs["collate_fn"] = collate
    return DataLoader(dataset, drop_last=True, **kwargs)


def cycle(loader: DataLoader) -> Iterator[Any]:
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


def shutdown(loader: DataLoader | None, batches: Iterator[Any] | None) -> None:
    """End the loader's workers, persistent ones included, whatever state the trial is in."""
    if batches is not None:
        batches.close()  # type: ignore[attr-defined]  # ends the loader iterator: non-persistent workers exit
    if loader is not None:
        iterator = getattr(loader, "_iterator", None)  # persistent workers live here
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()  # noqa: SLF001 - DataLoader has no public shutdown
        loader._iterator = None  # noqa: SLF001 - persistent workers live in the kept iterator


def _too_small(size: int | None, micro: int, world: int) -> str:
    have = f"{size} samples" if size is not None else "too few samples on this rank"
    return (f"the dataset yields no full micro-batch of {micro} samples per rank x {world} rank(s) "
            f"({have}); make it larger or the micro_batch_size smaller")


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``batch`` with ``fn`` applied to each of its tensors (dicts, lists, tuples and named
    tuples kept; anything else as it is)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        mapped = [map_tensors(v, fn) for v in batch]
        return type(batch)(*mapped) if hasattr(batch, "_fields") else type(batch)(mapped)
    return batch


def cast_floats(batch: Any, dtype: torch.dtype) -> Any:
    """The batch with its floating-point tensors in ``dtype`` (the rest as they are).

    DeepSpeed's bf16 / fp16 engines hold half-precision weights and turn off an autocast
    entered outside them (``autocast_if_enabled``, 0.19, on CUDA): fp32 data then meets
    bf16 weights ("mat1 and mat2 must have the same dtype", first seen on an H200). Casting
    the floating-point inputs is what transformers' Trainer does for DeepSpeed
    (``_prepare_input``), so a trial runs what the user's job runs."""
    return map_tensors(batch, lambda t: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t)


def to_device(batch: Any, device: torch.device, non_blocking: bool, channels_last: bool = False) -> Any:
    """The batch's tensors on ``device`` (dicts, lists, tuples and named tuples kept);
    with ``channels_last``, 4-D floating-point tensors (images) in that memory format."""

    def move(t: torch.Tensor) -> torch.Tensor:
        if channels_last and t.dim() == 4 and t.is_floating_point():
            return t.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return t.to(device, non_blocking=non_blocking)

    return map_tensors(batch, move)
