"""``tuner.Probe`` in a Hugging Face ``Trainer``::

    from tuner.integrations.hf import ProbeCallback

    probe = ProbeCallback(warmup=10, measure=50)
    trainer = Trainer(..., callbacks=[probe])
    trainer.train()
    probe.summary          # DESIGN.md metric names; also printed on rank 0

Data wait is timed where it happens: the callback wraps the iterator of the Trainer's own
training DataLoader (the Trainer fetches a step's micro-batches up front, before
``on_step_begin``), so logging, evaluation and checkpointing between steps never count as
waiting for data. A step is an optimizer step (``on_step_end``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import TrainerCallback

from tuner.harness import distributed
from tuner.harness.metrics import Window
from tuner.harness.system.flops import holds_convolutions
from tuner.scriptmode.callbacks.common import ProbeCallbackBase


class ProbeCallback(ProbeCallbackBase, TrainerCallback):
    """Measures the Trainer's steps with a :class:`tuner.Probe` (arguments: see
    :class:`~tuner.scriptmode.callbacks.common.ProbeCallbackBase`)."""

    trainer_name = "transformers.Trainer"

    def __init__(self, warmup: int = 5, measure: int | str | None = None, trainer: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(warmup, measure, **kwargs)
        self.trainer = trainer
        """The Trainer (``adapt: hf`` hands it over): in a trial that asks, it steps once on the
        batch of its dataset's largest samples after the window (:meth:`_largest`)."""
        self._loader: Any = None
        self._loader_class: type | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
        probe = self._start(args.device, "bf16" if args.bf16 else "fp16" if args.fp16 else None)
        optim = str(getattr(args.optim, "value", args.optim))
        if "fused" in optim:  # the Trainer's own choice (transformers 5's default is adamw_torch_fused)
            probe.ran["optimizer_impl"] = "fused"
        if isinstance(kwargs.get("model"), torch.nn.Module):  # for advice only some models can take
            probe.ran["model"] = {"convolutions": holds_convolutions(kwargs["model"])}
            self._watch_attention()
        if train_dataloader is None:
            raise RuntimeError("the Trainer passed no train_dataloader to on_train_begin; "
                               "this transformers version is not supported by tuner's callback")
        self._wrap(train_dataloader)
        if self.trainer is not None and probe.largest_batch_file is not None:
            probe.before_report = functools.partial(self._largest, train_dataloader)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        assert self.probe is not None
        self._attention_seen()
        self.probe.step()
        if self.stop_when_done and self.probe.done:
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unwrap()
        self._finish()

    def _largest(self, loader: Any, window: Window) -> None:
        """The Trainer's own step (its ``training_step`` x accumulation, then its optimizer) on
        the batch its collator makes of the dataset's largest samples, its peak on ``window``."""
        from tuner.trial import largest_batch  # the trial's scan: loaded where a trial asks for it

        trainer, probe = self.trainer, self.probe
        assert probe is not None
        if getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False):
            probe.notes.append("largest batch: not checked: DeepSpeed and FSDP under the Trainer step through "
                               "their own engines")
            return
        args, base = trainer.args, getattr(loader, "base_dataloader", loader)
        micro, kept = args.per_device_train_batch_size, probe.largest_batch_file
        assert kept is not None
        keep = micro * args.gradient_accumulation_steps * args.world_size  # the global batch: every trial's
        found = distributed.broadcast(largest_batch.scan_kept(loader.dataset, keep, base.num_workers, kept)
                                      if distributed.is_main_process() else None)
        probe.notes.append(found.line())
        if not found.varies:
            return
        batch = loader.collate_fn(found.samples(loader.dataset, micro))

        def step() -> None:
            for _ in range(trainer.args.gradient_accumulation_steps):
                trainer.training_step(trainer.model_wrapped, batch)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad()

        largest_batch.peak_of(step, trainer.args.device, window)

    def _wrap(self, loader: Any) -> None:
        """Time every ``next()`` on the Trainer's loader: its ``__iter__`` goes through the
        probe (the loader's class is swapped for a subclass, and swapped back at the end).
        Accelerate's ``DataLoaderShard`` forbids that (``__class__`` is a property) and
        iterates the plain DataLoader it holds as ``base_dataloader``: that one is wrapped."""
        loader = getattr(loader, "base_dataloader", loader)
        probe, cls = self.probe, type(loader)
        assert probe is not None

        def __iter__(self_: Any) -> Any:
            return probe.loader(cls.__iter__(self_))

        loader.__class__ = type(cls.__name__, (cls,), {"__iter__": __iter__, "__module__": cls.__module__})
        self._loader, self._loader_class = loader, cls

    def _unwrap(self) -> None:
        if self._loader is not None and self._loader_class is not None:
            self._loader.__class__ = self._loader_class
        self._loader = self._loader_class = None
