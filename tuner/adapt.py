"""Zero-change script mode: tune an Accelerate or DeepSpeed script with no tuner code in it.

``adapt: accelerate`` or ``adapt: deepspeed`` in a script recipe launches each trial as
``torchrun ... -m tuner.adapt SCRIPT ARGS``. This module applies the trial's knobs the way
the library itself takes them, measures the loop through the library's own objects, then
runs the script unchanged (as ``__main__``).

Accelerate:
- mixed precision and gradient accumulation: ``ACCELERATE_MIXED_PRECISION`` and
  ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` (set by the launcher, as ``accelerate launch``
  sets them);
- the loader knobs and the micro-batch: the first ``DataLoader`` passed to
  ``accelerator.prepare`` is rebuilt with the trial's ``batch_size``, ``num_workers``,
  ``prefetch_factor``, ``pin_memory``, ``persistent_workers`` (its dataset, sampling order,
  collate function and ``drop_last`` kept);
- measurement: a :class:`tuner.Probe` times that loader's ``next()`` as data wait and counts
  an optimizer step when Accelerate really stepped (``sync_gradients``); it watches the
  DDP model ``prepare`` returns (exposed all-reduce time).

DeepSpeed:
- the config the script gives ``deepspeed.initialize`` (``config=``, ``config_params=`` or
  ``args.deepspeed_config``) gets the trial's keys set, the rest kept
  (:meth:`tuner.TrialConfig.ds_config`): batch sizes, accumulation, ZeRO stage, bf16/fp16;
- the first torch ``DataLoader`` the script iterates after ``initialize`` is the training
  loader: it is rebuilt with the trial's loader knobs (its sampler kept) and measured;
- an optimizer step is counted at each accumulation boundary of ``engine.step()``; the
  engine's collectives are timed (``Probe.watch``).

Never silently half-applied: a script that passes ``mixed_precision`` or a gradient
accumulation plugin to ``Accelerator`` itself (those win over the environment), that
never passes a DataLoader through ``prepare`` (or, under DeepSpeed, iterates none), whose
loader has no plain ``batch_size``, or whose optimizer steps do not take global batch /
world size samples (no ``accelerator.accumulate``; a DeepSpeed loader with its own batch
size: the probe's check on the second step) stops with a message saying which and what
to do; the trial is recorded as an error with that reason.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

from tuner.export import ACCELERATE_MIXED_PRECISION
from tuner.recipe import ADAPT_MODES
from tuner.script import TrialConfig, config, read_trial


class AdaptError(RuntimeError):
    """The script does something that keeps a knob of the trial from being applied."""


def environment(mode: str, knobs: dict[str, Any], global_batch: int, world: int) -> dict[str, str]:
    """The variables the launcher sets for a trial of ``mode`` (Accelerate reads them)."""
    if mode != "accelerate":
        return {}
    accum = global_batch // (int(knobs["micro_batch_size"]) * world)
    return {"ACCELERATE_MIXED_PRECISION": ACCELERATE_MIXED_PRECISION[knobs["amp_dtype"]],
            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": str(accum)}


def install_accelerate(cfg: TrialConfig) -> None:
    """Wrap ``Accelerator.__init__`` (check what it took) and ``Accelerator.prepare``
    (rebuild and measure the loader, count real optimizer steps)."""
    import accelerate
    from torch.utils.data import DataLoader

    from tuner.probe import Probe

    cls = accelerate.Accelerator
    original_init, original_prepare = cls.__init__, cls.prepare
    state: dict[str, Any] = {"probe": None, "loader": False}

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if self.mixed_precision != ACCELERATE_MIXED_PRECISION[cfg.amp_dtype]:
            raise AdaptError(
                f"tuner (adapt: accelerate): the trial runs amp_dtype={cfg.amp_dtype} (mixed_precision="
                f"{ACCELERATE_MIXED_PRECISION[cfg.amp_dtype]!r} through ACCELERATE_MIXED_PRECISION), "
                "but the script's Accelerator has "
                f"mixed_precision={self.mixed_precision!r}: it passes mixed_precision itself, which wins over the "
                "environment. Drop that argument (accelerate launch sets it the same way), or fix amp_dtype "
                "in the recipe's space")
        if self.gradient_accumulation_steps != cfg.grad_accum_steps:
            raise AdaptError(
                f"tuner (adapt: accelerate): the trial needs {cfg.grad_accum_steps} gradient accumulation steps "
                f"(ACCELERATE_GRADIENT_ACCUMULATION_STEPS), but the script's Accelerator has "
                f"{self.gradient_accumulation_steps}: it passes a GradientAccumulationPlugin itself. Pass "
                "gradient_accumulation_steps through the environment instead, or fix micro_batch_size")
        if state["probe"] is None:  # on the device Accelerate chose: CUDA events, peak memory, MFU there
            state["probe"] = Probe(device=self.device, amp_dtype=cfg.amp_dtype)

    def prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe = state["probe"]
        args = list(args)
        train_at = None
        if not state["loader"]:
            train_at = next((i for i, a in enumerate(args) if isinstance(a, DataLoader)), None)
            if train_at is not None:
                args[train_at] = rebuild_loader(args[train_at], cfg)
                state["loader"] = True
        out = original_prepare(self, *args, **kwargs)
        results = list(out) if isinstance(out, tuple) else [out]
        for i, obj in enumerate(results):
            if i == train_at:
                _measure_loader(obj, probe)
            elif isinstance(obj, accelerate.optimizer.AcceleratedOptimizer):
                _count_steps(obj, probe, state)
            else:
                _watch(obj, probe)
        return out

    cls.__init__, cls.prepare = __init__, prepare  # type: ignore[method-assign]


def install_deepspeed(cfg: TrialConfig) -> None:
    """Wrap ``deepspeed.initialize`` (the trial's keys set into the script's config) and,
    after it, the first DataLoader the script iterates (rebuilt with the trial's loader
    knobs, measured); count an optimizer step at each accumulation boundary."""
    import deepspeed
    from torch.utils.data import DataLoader

    from tuner.probe import Probe

    original_initialize, original_iter = deepspeed.initialize, DataLoader.__iter__
    state: dict[str, Any] = {"probe": None, "loader": None, "rebuilt": None}

    def initialize(*args: Any, **kwargs: Any) -> Any:
        base = kwargs.pop("config", None) or kwargs.pop("config_params", None)
        ns = kwargs.get("args", args[0] if args else None)
        if base is None and getattr(ns, "deepspeed_config", None):
            base, ns.deepspeed_config = ns.deepspeed_config, None  # one config, with the trial's keys in it
        kwargs["config"] = cfg.ds_config(base)
        out = original_initialize(*args, **kwargs)
        engine = out[0]
        if state["probe"] is None:
            state["probe"] = Probe(device=engine.device, amp_dtype=cfg.amp_dtype)
            state["probe"].watch(engine)
            _patch_method(engine, "step", step)
        return out

    def step(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        boundary = self.is_gradient_accumulation_boundary()  # asked before: step() moves the count on
        out = original(self, *args, **kwargs)
        if boundary:
            if state["loader"] is None:
                raise AdaptError("tuner (adapt: deepspeed): the engine stepped, but the script iterated no "
                                 "torch DataLoader after deepspeed.initialize, so the trial's loader knobs were "
                                 "not applied and data wait cannot be measured; iterate a DataLoader (or pass "
                                 "training_data to deepspeed.initialize)")
            state["probe"].step()
        return out

    def __iter__(self: Any) -> Any:
        if state["loader"] is None and state["probe"] is not None:
            state["loader"] = self  # the training loader: the first iterated after initialize
        if self is not state["loader"]:
            return original_iter(self)
        if state["rebuilt"] is None:
            state["rebuilt"] = rebuild_loader(self, cfg, "deepspeed")
        return state["probe"].loader(original_iter(state["rebuilt"]))

    deepspeed.initialize = initialize
    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]


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


def _measure_loader(loader: Any, probe: Any) -> None:
    """This one loader's iterations go through the probe (timed ``next()``)."""
    _patch_method(loader, "__iter__", lambda original, self: probe.loader(original(self)))


def _count_steps(optimizer: Any, probe: Any, state: dict[str, Any]) -> None:
    """A probe step each time Accelerate really stepped (not an accumulation micro-step)."""

    def step(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if self.gradient_state.sync_gradients:
            if not state["loader"]:
                raise AdaptError("tuner (adapt: accelerate): the script stepped its optimizer but never passed a "
                                 "DataLoader through accelerator.prepare, so the trial's loader knobs and "
                                 "micro-batch were not applied; prepare the training DataLoader with the model")
            probe.step()
        return out

    _patch_method(optimizer, "step", step)


def _patch_method(obj: Any, name: str, wrapper: Any) -> None:
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


def _watch(obj: Any, probe: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(obj, DistributedDataParallel):
        probe.watch(obj)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    trial = read_trial()
    if trial is None or not argv:
        print("usage: TUNER_TRIAL=... torchrun ... -m tuner.adapt SCRIPT [ARGS]: the tuner launches this for "
              "script recipes with adapt:, it is not meant to be run by hand", file=sys.stderr)
        return 2
    mode = trial.get("adapt")
    if mode not in ADAPT_MODES:
        print(f"tuner.adapt: unknown mode {mode!r}; expected one of {', '.join(ADAPT_MODES)}", file=sys.stderr)
        return 2
    (install_accelerate if mode == "accelerate" else install_deepspeed)(config())
    script = Path(argv[0]).resolve()
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
