"""The batch lever: samples per rank per forward, at the recipe's fixed global batch (the
accumulation steps follow from it: :class:`tuner.inputs.plan.Plan`).
"""

from __future__ import annotations

from tuner.inputs.lever import Applied, Exported, Lever, MemoryTerm, ScriptRoutes
from tuner.inputs.levers.common import TRAINER

DECLARED: tuple[Lever, ...] = (
    Lever("micro_batch_size", "samples per rank per forward", minimum=1, group="batch", ordered=True,
          label="micro={}",
          suggest=((), "a larger micro_batch_size (fuller kernels)"),
          risk="optimisation: same global batch, but BatchNorm statistics and padding are per micro-batch",
          applied=Applied("batch", loader_kwarg="batch_size"),
          exported=Exported({"dataloader.json": "batch_size", "ds_config.json": "train_micro_batch_size_per_gpu",
                             "hf_training_args.json": "per_device_train_batch_size",
                             "torchtitan.toml": "local_batch_size",
                             "lightning_trainer.yaml": "data.batch_size, trainer.accumulate_grad_batches"}),
          memory=MemoryTerm("per_sample"),
          script=ScriptRoutes(TRAINER)),
)
