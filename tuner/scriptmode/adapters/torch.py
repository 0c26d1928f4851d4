"""``adapt: torch``: any PyTorch training loop, unchanged, measured through PyTorch itself.

- A step is an optimizer step: PyTorch's global post-step hook; the first optimizer that
  steps is the training one. Accumulation is the script's own.
- The training DataLoader is the one whose batch came last before the first optimizer step
  (an eval loader is never taken for it). Loader knobs the script does not take itself are
  applied by rebuilding that loader from the second step on.
- With no DataLoader, steps and samples/s are measured and ``data_wait_share`` is null.
- DDP's all-reduces are timed by a communication hook attached at its first forward; a
  script with a hook of its own keeps it, and ``comm_share`` is then unknown, with why.
"""

from __future__ import annotations

from typing import Any, Iterator

from tuner.harness.system.devices import accelerator_of
from tuner.harness.system.flops import AttentionCalls, trains_convolutions
from tuner.scriptmode.adapters.common import rebuild_loader
from tuner.scriptmode.config import TrialConfig


class _Watch:
    """The adapter's state inside the script's process: the probe, the loaders seen, the
    training loader and optimizer once the first step names them."""

    def __init__(self, cfg: TrialConfig, rebuild: list[str]) -> None:
        from tuner.scriptmode.probe import Probe

        self.cfg, self.rebuild = cfg, rebuild
        self.probe = Probe()
        self.optimizer: Any = None
        self.last_loader: Any = None
        """The loader whose batch came last (before the first step: the training one)."""
        self.training: Any = None
        self.rebuilt: Any = None
        self.attention = AttentionCalls()
        """Watching for attention calls until the first optimizer step (for advice)."""
        self.attention.start()

    def batches(self, loader: Any, source: Iterator[Any], original_iter: Any,
                switched: bool = False) -> Iterator[Any]:
        """``loader``'s batches, each ``next()`` timed; the training loader's switch to its
        rebuilt twin happens here, between two batches (``switched``: ``source`` already is
        the rebuilt loader's, a later epoch)."""
        while True:
            if self.rebuilt is not None and loader is self.training and not switched:
                _shutdown(source)
                source, switched = original_iter(self.rebuilt), True
            asked = self.probe.mark() if loader is self.training else None
            try:
                batch = next(source)
            except StopIteration:
                return
            self.last_loader = loader
            if asked is not None:
                self.probe.record_fetch(asked, batch)
            yield batch

    def stepped(self, optimizer: Any) -> None:
        """After an ``optimizer.step()``: the first names the training optimizer and loader."""
        if self.optimizer is None:
            self.optimizer = optimizer
            self._first_step(optimizer)
        if optimizer is not self.optimizer:
            return
        per_rank = self.cfg.global_batch_size // self.cfg.world_size
        self.probe.step(None if self.training is not None else per_rank)

    def ddp(self, model: Any, own_hook: bool) -> None:
        """Time ``model``'s all-reduces, unless the script hooked it itself."""
        if not own_hook:
            self.probe.watch(model)
            return
        why = self.probe.unmeasured["comm_share"] = "the script registers its own DDP communication hook"
        note = (f"adapt: torch: {why} (DDP takes one), so the tuner's is not attached and comm_share is not "
                "measured (null)")
        if note not in self.probe.notes:
            self.probe.notes.append(note)

    def _first_step(self, optimizer: Any) -> None:
        model: dict[str, bool] = {"convolutions": trains_convolutions(optimizer)}  # for advice only some take
        attention = self.attention.stop()
        if attention is not None:
            model["attention"] = attention
        self.probe.ran["model"] = model
        device = accelerator_of(p for group in optimizer.param_groups for p in group["params"])
        if device is not None and self.probe.window_start is None:  # not the CPU copies under offload
            self.probe.use_device(device)
        self.training = self.last_loader
        if self.training is None:
            why = "the script iterated no torch DataLoader before its first optimizer step"
            self.probe.unmeasured.update(dict.fromkeys(("data_wait_share", "transfer_share",
                                                        "stall_free_samples_per_s"), why))
            self.probe.notes.append(f"adapt: torch: {why}, so data wait is not measured (null); samples/s counts the "
                                    "trial's global batch per step")
        elif self.rebuild:
            self.rebuilt = rebuild_loader(self.training, self.cfg, "torch", only=self.rebuild)


def install(cfg: TrialConfig, trial: dict[str, Any]) -> None:
    """Watch every DataLoader's iterator, every optimizer step and every DDP model."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader

    watch = _Watch(cfg, list(trial.get("rebuild") or []))
    original_iter, original_ddp_init = DataLoader.__iter__, DistributedDataParallel.__init__
    original_forward, original_register = DistributedDataParallel.forward, DistributedDataParallel.register_comm_hook
    waiting: dict[int, Any] = {}
    """DDP models built and not yet run: hooked at their first forward, after the script's own hook, if any."""
    own_hook: set[int] = set()

    def __iter__(self: Any) -> Any:
        if self is watch.training and watch.rebuilt is not None:  # a later epoch: straight to the rebuilt one
            return watch.batches(self, original_iter(watch.rebuilt), original_iter, switched=True)
        return watch.batches(self, original_iter(self), original_iter)

    def ddp_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_ddp_init(self, *args, **kwargs)
        waiting[id(self)] = self

    def register_comm_hook(self: Any, state: Any, hook: Any) -> Any:
        own_hook.add(id(self))
        return original_register(self, state, hook)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if waiting.pop(id(self), None) is not None:  # before its first backward, as DDP requires
            watch.ddp(self, id(self) in own_hook)
        return original_forward(self, *args, **kwargs)

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
    DistributedDataParallel.__init__ = ddp_init  # type: ignore[method-assign]
    DistributedDataParallel.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    DistributedDataParallel.forward = forward  # type: ignore[method-assign]
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: watch.stepped(optimizer))


def _shutdown(iterator: Any) -> None:
    """End a replaced iterator's workers now rather than at garbage collection."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
