"""``tuner.Probe`` in a Lightning ``Trainer``::

    from tuner.integrations.lightning import ProbeCallback

    probe = ProbeCallback(warmup=10, measure=50)
    trainer = lightning.Trainer(..., callbacks=[probe])
    trainer.fit(model, train_dataloaders=loader)
    probe.summary          # DESIGN.md metric names; also printed on rank 0

Lightning creates its data iterator before any callback runs, so the callback cannot wrap
it; data wait is the time from the end of one training batch to the start of the next,
which is where Lightning fetches (it prefetches one batch ahead). Lightning's own
bookkeeping between batches (learning-rate schedulers, logger flushes) lands there too;
validation runs are left out (the gap restarts after them). A step is an optimizer step:
with ``accumulate_grad_batches=k``, k batches.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from tuner.harness.system.flops import holds_convolutions
from tuner.scriptmode.callbacks.common import ProbeCallbackBase


class ProbeCallback(ProbeCallbackBase, pl.Callback):
    """Measures the Trainer's steps with a :class:`tuner.Probe` (arguments: see
    :class:`~tuner.scriptmode.callbacks.common.ProbeCallbackBase`)."""

    trainer_name = "lightning.Trainer"

    def __init__(self, warmup: int = 5, measure: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(warmup, measure, **kwargs)
        self._batch_end: Any = None
        self._steps_seen = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        precision = str(trainer.precision)
        probe = self._start(pl_module.device, "bf16" if "bf16" in precision else "fp16" if precision.startswith("16")
                            else None)
        probe.ran["model"] = {"convolutions": holds_convolutions(pl_module)}  # for advice only some models take
        self._watch_attention()
        self._steps_seen = trainer.global_step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        assert self.probe is not None
        # From the previous batch's end (or now): on a GPU, the gap the device sat idle.
        self.probe.record_fetch(self._batch_end if self._batch_end is not None else self.probe.mark(), batch)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        assert self.probe is not None
        if trainer.global_step != self._steps_seen:  # the optimizer stepped on this batch
            self._steps_seen = trainer.global_step
            self._attention_seen()
            self.probe.step()
            if self.stop_when_done and self.probe.done:
                trainer.should_stop = True
        self._batch_end = self.probe.mark()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._batch_end = None  # a validation run between batches is not data wait

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish()
