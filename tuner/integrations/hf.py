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

from typing import Any

from transformers import TrainerCallback

from tuner.integrations.report import nothing_measured as _nothing_measured
from tuner.integrations.report import print_summary
from tuner.probe import Probe


class ProbeCallback(TrainerCallback):
    """Measures the Trainer's steps with a :class:`tuner.Probe`.

    Args:
        warmup, measure: as for :class:`tuner.Probe` (``measure=None``: every step after
            the warm-up).
        stop_when_done: end training once the measured window is complete.
        report: print a one-line summary on rank 0 when training ends.
        **probe_kwargs: passed to :class:`tuner.Probe` (``flops_per_sample``, ``nvtx``, ...).
    """

    def __init__(self, warmup: int = 5, measure: int | None = None, *, stop_when_done: bool = False,
                 report: bool = True, **probe_kwargs: Any) -> None:
        self.warmup, self.measure = warmup, measure
        self.stop_when_done, self.report = stop_when_done, report
        self.probe_kwargs = probe_kwargs
        self.probe: Probe | None = None
        self.summary: dict[str, Any] | None = None
        self._loader: Any = None
        self._loader_class: type | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
        if args.bf16:
            self.probe_kwargs.setdefault("amp_dtype", "bf16")
        elif args.fp16:
            self.probe_kwargs.setdefault("amp_dtype", "fp16")
        self.probe = Probe(self.warmup, self.measure, device=args.device, **self.probe_kwargs)
        if train_dataloader is None:
            raise RuntimeError("the Trainer passed no train_dataloader to on_train_begin; "
                               "this transformers version is not supported by tuner's callback")
        self._wrap(train_dataloader)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        assert self.probe is not None
        self.probe.step()
        if self.stop_when_done and self.probe.done:
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unwrap()
        if self.probe is None or not self.probe.window.step_times:
            _nothing_measured(self.warmup)
            return
        self.summary = self.probe.summary()  # a collective under several ranks: all call it
        self.probe.close()
        if self.report:
            print_summary(self.summary, "transformers.Trainer")

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
