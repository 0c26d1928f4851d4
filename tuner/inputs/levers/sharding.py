"""Data parallelism and sharding: DeepSpeed's ZeRO stage and its buckets, FSDP2, the
optimizer offloaded to the host, DDP's gradient buckets. The levers that move a rank's
model states say their share (:mod:`tuner.inputs.model_states`).
"""

from __future__ import annotations

from typing import Any

from tuner.inputs.lever import Applied, Exported, Lever, MemoryTerm, ScriptRoutes
from tuner.inputs.machine import Machine
from tuner.inputs.model_states import offloaded_states, sharded_states, zero_states


def _no_lightning(m: Machine) -> list[tuple[Any, str, Any]]:
    """What Lightning's DeepSpeed strategy refuses, whatever DeepSpeed itself can do."""
    return [] if m.cuda else [
        (stage, "Lightning's DeepSpeed strategy runs only on CUDA GPUs (its own check, "
                "lightning.pytorch.strategies.DeepSpeedStrategy.setup_environment)", 0) for stage in (1, 2, 3)]


DECLARED: tuple[Lever, ...] = (
    Lever("zero_stage", "DeepSpeed ZeRO stage; 0 = plain data parallel", minimum=0, maximum=3, group="sharding",
          label="zero={}",
          ordered=True, alternative=("fsdp", "off"),
          risk="checkpoints are partitioned (DeepSpeed's zero_to_fp32.py consolidates them)", engine="deepspeed",
          runs_on="deepspeed", proven=True,
          applied=Applied("engine"),
          exported=Exported({"ds_config.json": "zero_optimization.stage", "accelerate_config.yaml": "distributed_type",
                             "lightning_trainer.yaml": "trainer.strategy"}),
          memory=MemoryTerm("states", states=zero_states),
          script=ScriptRoutes(frozenset({"hf", "lightning", "deepspeed"}), refused_under={"lightning": _no_lightning})),
    Lever("fsdp", "FSDP2 fully_shard per block and on the root",
          aliases=((False, "off"),), group="sharding",
          alternative=("zero_stage", 0),
          refused=lambda m: [] if m.fsdp2 else [
              (mode, "this PyTorch has no torch.distributed.fsdp.fully_shard (FSDP2 needs torch >= 2.6)", "off")
              for mode in ("full_shard", "shard_grad_op")], reference="off",
          risk="parameters are DTensors: save with torch.distributed.checkpoint (DCP), not a plain state_dict",
          label="fsdp={}", engine="fsdp", runs_on="torch", proven=True,
          suggest=(("off", "shard_grad_op"), "fsdp: shard_grad_op (one all-gather fewer per block)"),
          advises=("shard_grad_op",),
          applied=Applied("engine"),
          exported=Exported({"accelerate_config.yaml": "fsdp_config", "hf_training_args.json": "fsdp / fsdp_config",
                             "torchtitan.toml": "data_parallel_shard_degree",
                             "lightning_trainer.yaml": "trainer.strategy"}),
          memory=MemoryTerm("states", states=sharded_states)),
    Lever("ddp_bucket_cap_mb", "DDP gradient bucket size, MiB (DDP only)", minimum=1, group="communication",
          ordered=True, risk="larger buckets start all-reducing later in the backward",
          label="bucket={}MB",
          applied=Applied("engine"),
          exported=Exported({"hf_training_args.json": "ddp_bucket_cap_mb",
                             "torch_settings.py": "model = DistributedDataParallel(model, bucket_cap_mb={!r})"}),
          script=ScriptRoutes(frozenset({"hf"}))),
    Lever("gradient_as_bucket_view", "DDP: gradients as views of its all-reduce buckets (DDP only)",
          group="communication", label="grad_view",
          risk="each gradient is a view into a DDP bucket: code that assigns p.grad, or keeps a gradient past the "
               "step, sees it change (zero_grad and the optimizers are fine)",
          applied=Applied("engine"),
          exported=Exported({"torch_settings.py": "model = DistributedDataParallel(model, gradient_as_bucket_view="
                                                  "True)",
                             "lightning_trainer.yaml": "trainer.strategy (DDPStrategy gradient_as_bucket_view)"})),
    Lever("static_graph", "DDP: the model's graph is the same every step (DDP only)",
          group="communication", label="static_graph",
          risk="a model whose graph or used parameters change between steps (a branch taken by the data, layers "
               "frozen mid-run) errors or trains wrong",
          applied=Applied("engine"),
          exported=Exported({"torch_settings.py": "model = DistributedDataParallel(model, static_graph=True)",
                             "lightning_trainer.yaml": "trainer.strategy (DDPStrategy static_graph)"})),
    Lever("overlap_comm", "DeepSpeed: overlap gradient reduction with the backward (ZeRO >= 1)",
          group="communication",
          risk="DeepSpeed holds extra buffers for the overlapped reduction (about 4.5x reduce_bucket_size)",
          label="overlap",
          applied=Applied("engine"),
          exported=Exported({"ds_config.json": "zero_optimization.overlap_comm"}),
          script=ScriptRoutes(frozenset({"hf", "deepspeed"}))),
    Lever("reduce_bucket_size", "DeepSpeed: elements reduced at once (ZeRO >= 1)", minimum=1,
          group="communication", ordered=True,
          risk="larger buckets: more memory for the reduction, fewer and larger collectives", label="reduce={:.0e}",
          applied=Applied("engine"),
          exported=Exported({"ds_config.json": "zero_optimization.reduce_bucket_size"}),
          script=ScriptRoutes(frozenset({"hf", "deepspeed"}))),
    Lever("allgather_bucket_size", "DeepSpeed: elements all-gathered at once (ZeRO 1-2)",
          minimum=1, group="communication", ordered=True,
          risk="larger buckets: more memory for the gathered parameters, fewer collectives", label="gather={:.0e}",
          applied=Applied("engine"),
          exported=Exported({"ds_config.json": "zero_optimization.allgather_bucket_size"}),
          script=ScriptRoutes(frozenset({"hf", "deepspeed"}))),
    Lever("offload_optimizer", "optimizer states (and step) on the host (ZeRO >= 1 or FSDP2)",
          aliases=((False, "none"), (None, "none")), group="sharding",
          risk="host memory and PCIe traffic: the optimizer state and step live on the CPU",
          label="offload={}", proven=True,
          applied=Applied("engine"),
          exported=Exported({"ds_config.json": "zero_optimization.offload_optimizer"}),
          memory=MemoryTerm("states", states=offloaded_states),
          script=ScriptRoutes(frozenset({"hf", "deepspeed"}))),
)
