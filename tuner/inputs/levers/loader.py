"""The loader's levers: DataLoader workers, how far ahead they load, pinned batches, workers
kept between epochs, batches handed over out of order. The trial applies them all in one
place (:func:`tuner.trial.data.make_loader`, through :func:`tuner.inputs.levers.loader_kwargs`),
and script mode's adapters rebuild the script's own loader with them.
"""

from __future__ import annotations

from typing import Any

from tuner.inputs.lever import Applied, Exported, Lever, MemoryTerm, ScriptRoutes
from tuner.inputs.levers.common import ALL, REBUILT


def _no_cuda(value: Any, fallback: Any, why: str) -> Any:
    return lambda m: [] if m.cuda else [(value, why, fallback)]


DECLARED: tuple[Lever, ...] = (
    Lever("num_workers", "DataLoader worker processes per rank", minimum=0, group="loader", ordered=True,
          label="workers={}",
          suggest=((), "more loader workers"),
          risk="host memory: every worker holds its own copy of what the dataset touches",
          applied=Applied("loader", loader_kwarg="num_workers"),
          exported=Exported({"dataloader.json": "num_workers", "hf_training_args.json": "dataloader_num_workers",
                             "lightning_trainer.yaml": "data.num_workers"}),
          memory=MemoryTerm("workers"),
          script=ScriptRoutes(ALL)),
    Lever("prefetch_factor", "batches each worker loads ahead", minimum=1, group="loader",
          ordered=True, suggest=((), "a larger prefetch_factor"),
          risk="host memory: workers x prefetch_factor batches are in flight", label="prefetch={}",
          applied=Applied("loader", loader_kwarg="prefetch_factor"),
          exported=Exported({"dataloader.json": "prefetch_factor",
                             "hf_training_args.json": "dataloader_prefetch_factor"}),
          memory=MemoryTerm("workers"),
          script=ScriptRoutes(ALL)),
    Lever("pin_memory", "page-locked host batches (CUDA only)", group="loader", label="pinned",
          refused=_no_cuda(True, False, "no CUDA device; pinned memory only speeds host-to-GPU copies"),
          risk="pinned host memory is locked: too much starves the OS",
          applied=Applied("loader", loader_kwarg="pin_memory"),
          exported=Exported({"dataloader.json": "pin_memory", "hf_training_args.json": "dataloader_pin_memory"}),
          script=ScriptRoutes(ALL)),
    Lever("persistent_workers", "keep workers alive between epochs", group="loader",
          label="persistent", suggest=((True,), "persistent_workers: true"),
          risk="workers keep their state between epochs (a dataset that changes per epoch must allow it)",
          applied=Applied("loader", loader_kwarg="persistent_workers"),
          exported=Exported({"dataloader.json": "persistent_workers",
                             "hf_training_args.json": "dataloader_persistent_workers"}),
          script=ScriptRoutes(ALL)),
    Lever("in_order", "DataLoader in_order: false hands batches over as workers finish them",
          group="loader",
          refused=lambda m: [] if m.in_order else [
              (False, "this PyTorch's DataLoader has no in_order (needs torch >= 2.6)", True)],
          risk="batch order varies run to run (the same batches each epoch): not for order-sensitive training",
          label="out_of_order",
          applied=Applied("loader", loader_kwarg="in_order", kwarg_at_default=False),
          exported=Exported({"dataloader.json": "in_order"}),
          script=ScriptRoutes(REBUILT)),
)
