"""What the adapters share: the trial's loader rebuilt, one object's method routed through
a wrapper, a DDP model's all-reduces watched, and the error a script gets when it keeps a
knob from applying."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tuner.inputs.levers import LEVERS, loader_kwargs
from tuner.inputs.rules import applies
from tuner.inputs.script import LOADER_KNOBS
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
    take = set(only) if only is not None else {"micro_batch_size", *LOADER_KNOBS}
    mine = {name: getattr(cfg, name) if name in take else own_value(loader, name) for name in LOADER_KNOBS}
    settings: dict[str, Any] = {"batch_size": cfg.micro_batch_size if "micro_batch_size" in take else loader.batch_size,
                                **loader_kwargs(mine)}
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


def own_value(loader: Any, name: str) -> Any:
    """The script's loader's own value of a loader lever (the DataLoader's default where
    it keeps none: ``prefetch_factor`` is ``None`` without workers)."""
    value = getattr(loader, LEVERS[name].applied.loader_kwarg or name, None)
    return LEVERS[name].default if value is None else value


def kept_by_script(loader: Any, knobs: Mapping[str, Any]) -> dict[str, Any]:
    """A script's DataLoader's own values of the loader levers, where they differ from the
    trial's ``knobs``: the script set them itself, the trial did not change them, and they
    ran (``DataLoader(pin_memory=True)`` pins whatever the trial said). A lever is compared where it acts with
    the loader's own settings (its ``needs``): ``prefetch_factor`` means nothing without
    workers, ``pin_memory`` acts without them too (the main process pins). No loader lever's
    ``needs`` reads the world size: 1 is passed."""
    own = {n: own_value(loader, n) for n in LOADER_KNOBS}
    ran = {**knobs, **own}
    return {n: own[n] for n in LOADER_KNOBS
            if n in knobs and own[n] != knobs[n] and applies(n, ran, 1)}


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
