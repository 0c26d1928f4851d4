"""What the adapters share: the trial's loader rebuilt, one object's method routed through
a wrapper, a DDP model's all-reduces watched, and the error a script gets when it keeps a
knob from applying."""

from __future__ import annotations

from typing import Any

from tuner.scriptmode.config import TrialConfig


class AdaptError(RuntimeError):
    """The script does something that keeps a knob of the trial from being applied."""


def rebuild_loader(loader: Any, cfg: TrialConfig, mode: str = "accelerate") -> Any:
    """The same data in the same order with the trial's loader knobs and micro-batch."""
    from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

    if loader.batch_size is None:
        raise AdaptError(f"tuner (adapt: {mode}): the script's DataLoader takes a batch_sampler, so the trial's "
                         "micro_batch_size cannot be set on it; give it batch_size=, or tune it with "
                         "tuner.config() (recipes/scripts/train_plain.py shows how)")
    kwargs: dict[str, Any] = dict(
        collate_fn=loader.collate_fn, drop_last=loader.drop_last, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator, **cfg.dataloader_kwargs(),
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
