"""What the adapters share: the trial's loader rebuilt, one object's method routed through
a wrapper, a DDP model's all-reduces watched, and the error a script gets when it keeps a
knob from applying."""

from __future__ import annotations

from typing import Any, Sequence

from tuner.scriptmode.config import TrialConfig


class AdaptError(RuntimeError):
    """The script does something that keeps a knob of the trial from being applied."""


def rebuild_loader(loader: Any, cfg: TrialConfig, mode: str = "accelerate",
                   only: Sequence[str] | None = None) -> Any:
    """The same data in the same order with the trial's loader knobs and micro-batch.

    Args:
        only: the settings to take from the trial (knob names; ``micro_batch_size`` is the
            batch size); the others stay the loader's own. ``None``: all of them.
    """
    from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

    if loader.batch_size is None:
        raise AdaptError(f"tuner (adapt: {mode}): the script's DataLoader takes a batch_sampler, so the trial's "
                         "loader knobs cannot be set on it; give it batch_size=, or tune it with "
                         "tuner.config() (recipes/scripts/train_plain.py shows how)")
    take = set(only) if only is not None else {"micro_batch_size", "num_workers", "prefetch_factor", "pin_memory",
                                                "persistent_workers"}
    workers = cfg.num_workers if "num_workers" in take else loader.num_workers
    settings: dict[str, Any] = {
        "batch_size": cfg.micro_batch_size if "micro_batch_size" in take else loader.batch_size,
        "num_workers": workers,
        "pin_memory": cfg.pin_memory if "pin_memory" in take else loader.pin_memory,
    }
    if workers > 0:  # DataLoader refuses these without workers
        settings["prefetch_factor"] = (cfg.prefetch_factor if "prefetch_factor" in take
                                       else loader.prefetch_factor or 2)
        settings["persistent_workers"] = (cfg.persistent_workers if "persistent_workers" in take
                                          else loader.persistent_workers)
    kwargs: dict[str, Any] = dict(
        collate_fn=loader.collate_fn, drop_last=loader.drop_last, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator, **settings,
    )
    if not isinstance(loader.dataset, IterableDataset):
        if isinstance(loader.sampler, RandomSampler):
            kwargs["shuffle"] = True
        elif not isinstance(loader.sampler, SequentialSampler):
            kwargs["sampler"] = loader.sampler
    return DataLoader(loader.dataset, **kwargs)


def patch_method(obj: Any, name: str, wrapper: Any) -> None:
    """Route ``obj.name`` (and only this object's) through ``wrapper(original, self, ...)``.
    Patched on the class: special methods are looked up there, and Accelerate's loaders
    make ``__class__`` a read-only property, so a per-object subclass cannot be set."""
    cls = type(obj)
    original = getattr(cls, name)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is obj:
            return wrapper(original, self, *args, **kwargs)
        return original(self, *args, **kwargs)

    setattr(cls, name, method)


def watch_ddp(obj: Any, probe: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(obj, DistributedDataParallel):
        probe.watch(obj)
