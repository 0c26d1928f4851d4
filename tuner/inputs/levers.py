"""The levers, one declaration each (:class:`~tuner.inputs.lever.Lever`): adding a knob is
one entry here and its apply function; ``tests/structure/test_levers.py`` fails when an
entry lacks what a layer needs.

Declaration order is the order of a configuration's fields (``trials.csv`` columns) and
of the sampler's questions; :attr:`Lever.path` and :attr:`Lever.walk` order the
attribution and the guided walk.
"""

from __future__ import annotations

from typing import Any, Mapping

from tuner.inputs.lever import ADAPTERS, Lever
from tuner.inputs.levers_gpu import GPU_LEVERS
from tuner.inputs.machine import Machine

DEEPSPEED_BUCKET = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` / ``allgather_bucket_size`` (elements)."""
ALL = frozenset(ADAPTERS)
REBUILT = frozenset(ADAPTERS) - {"hf"}
"""Adapters that rebuild the script's training DataLoader (hf sets TrainingArguments'
``dataloader_*`` fields instead, and they have no ``in_order``)."""
TRAINER = frozenset({"hf", "lightning", "accelerate", "deepspeed"})
"""Adapters whose library takes the batch and precision (the torch adapter only watches)."""
ENGINES = "tuner.trial.engines"


def _workers(k: Mapping[str, Any], world: int) -> bool:
    return k["num_workers"] > 0  # DataLoader refuses these without workers


def _zero(k: Mapping[str, Any], world: int) -> bool:
    return k["zero_stage"] >= 1


def _data_parallel_only(k: Mapping[str, Any], world: int) -> bool:
    """DeepSpeed's engine and offload take no PyTorch tensor/pipeline layout: with one they
    mean nothing (the layout's data-parallel dimension shards with FSDP2 instead)."""
    return k["tensor_parallel"] * k["pipeline_parallel"] == 1


LAYOUT = f"{ENGINES}.parallelize:parallelize"
STATES = "tuner.inputs.model_states"


def _fsdp_conflict(k: Mapping[str, Any]) -> str | None:
    if k["fsdp"] != "off" and k["zero_stage"] > 0:
        return (f"fsdp: {k['fsdp']} and zero_stage: {k['zero_stage']} are two ways to shard the same "
                "model; choose one (fsdp: off, or zero_stage: 0)")
    return None


def _offload_conflict(k: Mapping[str, Any]) -> str | None:
    if k["offload_optimizer"] != "none" and k["zero_stage"] == 0 and k["fsdp"] == "off":
        return ("offload_optimizer: cpu needs a sharded optimizer to offload; use it with zero_stage >= 1 "
                "or fsdp: full_shard / shard_grad_op")
    return None


def _no_cuda(value: Any, fallback: Any, why: str) -> Any:
    return lambda m: [] if m.cuda else [(value, why, fallback)]


def _amp_refused(m: Machine) -> list[tuple[Any, str, Any]]:
    rows = []
    if not m.fp16:
        rows.append(("fp16", "fp16 autocast and loss scaling need a CUDA device" if not m.cuda
                     else "this GPU lacks fp16", "fp32"))
    if not m.bf16:
        rows.append(("bf16", "this GPU does not support bf16 (needs compute capability 8.0+)", "fp32"))
    return rows


def _matmul_refused(m: Machine) -> list[tuple[Any, str, Any]]:
    why = ("TF32 matmuls need a CUDA GPU; on this machine's CPU the setting changes nothing a search can "
           "measure")
    return [] if m.cuda else [("high", why, "highest"), ("medium", why, "highest")]


LEVERS: dict[str, Lever] = {lever.name: lever for lever in (
    Lever("num_workers", int, 0, "DataLoader worker processes per rank", minimum=0, group="loader",
          path=10, walk=70, ordered=True, verdicts={"data-bound": 0, "memory-bound (loader workers)": 0},
          suggest=((), "more loader workers"),
          risk="host memory: every worker holds its own copy of what the dataset touches",
          adapters=ALL, memory="workers", stage="loader", apply="tuner.trial.data:make_loader",
          loader_kwarg="num_workers",
          exports={"dataloader.json": "num_workers", "hf_training_args.json": "dataloader_num_workers",
                   "lightning_trainer.yaml": "data.num_workers"}),
    Lever("prefetch_factor", int, 2, "batches each worker loads ahead", minimum=1, group="loader", needs=_workers,
          path=20, walk=80, ordered=True, verdicts={"data-bound": 1, "memory-bound (loader workers)": 1},
          suggest=((), "a larger prefetch_factor"),
          risk="host memory: workers x prefetch_factor batches are in flight", label="prefetch={}",
          adapters=ALL, memory="workers", stage="loader", apply="tuner.trial.data:make_loader",
          loader_kwarg="prefetch_factor",
          exports={"dataloader.json": "prefetch_factor", "hf_training_args.json": "dataloader_prefetch_factor"}),
    Lever("pin_memory", bool, False, "page-locked host batches (CUDA only)", group="loader", path=40, walk=100,
          verdicts={"data-bound": 3, "input-transfer-bound": 0}, label="pinned",
          refused=_no_cuda(True, False, "no CUDA device; pinned memory only speeds host-to-GPU copies"),
          risk="pinned host memory is locked: too much starves the OS",
          adapters=ALL, stage="loader", apply="tuner.trial.data:make_loader", loader_kwarg="pin_memory",
          exports={"dataloader.json": "pin_memory", "hf_training_args.json": "dataloader_pin_memory"}),
    Lever("persistent_workers", bool, False, "keep workers alive between epochs", group="loader", needs=_workers,
          path=30, walk=90, verdicts={"data-bound": 2}, label="persistent",
          risk="workers keep their state between epochs (a dataset that changes per epoch must allow it)",
          adapters=ALL, stage="loader", apply="tuner.trial.data:make_loader", loader_kwarg="persistent_workers",
          exports={"dataloader.json": "persistent_workers",
                   "hf_training_args.json": "dataloader_persistent_workers"}),
    Lever("amp_dtype", str, "fp32", "autocast dtype", choices=("fp32", "bf16", "fp16"), group="precision",
          path=50, walk=10, reference="fp32", refused=_amp_refused,
          suggest=(("bf16", "fp16"), "amp_dtype: bf16 (or fp16 with loss scaling)"),
          verdicts={"memory-bound": 5, "host-cpu-saturated": 0, "host-bound": 3, "compute-bound": 2},
          risk="numerics: checked by the precision guard against the fp32 loss",
          adapters=TRAINER, memory="activations", prior={"fp32": 1.0, "bf16": 0.5, "fp16": 0.5},
          stage="engine", apply=f"{ENGINES}.base:autocast",
          exports={"ds_config.json": "bf16.enabled / fp16.enabled", "accelerate_config.yaml": "mixed_precision",
                   "hf_training_args.json": "bf16 / fp16", "torchtitan.toml": "mixed_precision_param",
                   "lightning_trainer.yaml": "trainer.precision"}),
    Lever("micro_batch_size", int, None, "samples per rank per forward", minimum=1, group="batch",
          path=70, walk=20, ordered=True, suggest=((), "a larger micro_batch_size (fuller kernels)"),
          verdicts={"communication-bound": 0, "memory-bound": 4, "host-cpu-saturated": 1, "host-bound": 0,
                    "compute-bound": 3},
          risk="optimisation: same global batch, but BatchNorm statistics and padding are per micro-batch",
          adapters=TRAINER, memory="per_sample", stage="batch", apply="tuner.trial.data:make_loader",
          loader_kwarg="batch_size",
          exports={"dataloader.json": "batch_size", "ds_config.json": "train_micro_batch_size_per_gpu",
                   "hf_training_args.json": "per_device_train_batch_size", "torchtitan.toml": "local_batch_size",
                   "lightning_trainer.yaml": "data.batch_size, trainer.accumulate_grad_batches"}),
    Lever("tensor_parallel", int, 1, "ranks one layer's matmuls are split over (DTensor colwise/rowwise)",
          minimum=1, group="layout", needs=lambda k, w: w > 1, path=75, walk=35, ordered=True,
          verdicts={"memory-bound": 6}, label="tp={}",
          risk="every block all-reduces its activations across the tensor-parallel group: keep it inside a node",
          memory="states", stage="engine", apply=LAYOUT, engine="layout",
          exports={"torchtitan.toml": "parallelism.tensor_parallel_degree",
                   "accelerate_config.yaml": "parallelism_config.parallelism_config_tp_size",
                   "lightning_trainer.yaml": "trainer.strategy (ModelParallelStrategy tensor_parallel_size)"}),
    Lever("pipeline_parallel", int, 1, "pipeline stages the model's blocks are cut into", minimum=1,
          group="layout", needs=lambda k, w: w > 1, path=76, walk=36, ordered=True,
          verdicts={"memory-bound": 7, "pipeline-bound": 1},
          label="pp={}", risk="the pipeline bubble: stages idle while the first micro-batches fill it",
          memory="states", stage="engine", apply=LAYOUT, engine="layout",
          exports={"torchtitan.toml": "parallelism.pipeline_parallel_degree",
                   "accelerate_config.yaml": "comment: Accelerate has no pipeline parallelism",
                   "lightning_trainer.yaml": "comment: Lightning has no pipeline parallelism"},
          export_with="tuner.inputs.exports.parallel:pipeline_exports"),
    Lever("pipeline_schedule", str, "1f1b", "how micro-batches flow through the stages",
          choices=("1f1b", "gpipe", "interleaved_1f1b"), group="layout",
          needs=lambda k, w: k["pipeline_parallel"] > 1, path=77, walk=37, label="{}",
          verdicts={"pipeline-bound": 0}, suggest=(("interleaved_1f1b",), "pipeline_schedule: interleaved_1f1b "
                                                                          "(two stages per rank: half the bubble)"),
          risk="gpipe holds every micro-batch's activations at once; interleaved halves the bubble for twice "
               "the stage-to-stage sends",
          memory="activations", prior={"1f1b": 1.0, "gpipe": 1.0, "interleaved_1f1b": 1.0}, stage="engine",
          apply=LAYOUT, exports={"torchtitan.toml": "parallelism.pipeline_parallel_schedule"}),
    Lever("sequence_parallel", bool, False, "norms and residual stream sharded over the sequence (tensor_parallel)",
          group="layout", needs=lambda k, w: k["tensor_parallel"] > 1 and k["pipeline_parallel"] == 1, path=78,
          walk=38, verdicts={"memory-bound": 8}, label="sp",
          risk="a reduce-scatter and an all-gather per region instead of one all-reduce; the sequence length must "
               "divide by tensor_parallel",
          memory="activations", prior={False: 1.0, True: 1.0}, stage="engine", apply=LAYOUT,
          exports={"torchtitan.toml": "comment: torchtitan shards the sequence with every tensor_parallel_degree"}),
    Lever("zero_stage", int, 0, "DeepSpeed ZeRO stage; 0 = plain data parallel", minimum=0, maximum=3,
          group="sharding", needs=_data_parallel_only, path=80, walk=30, ordered=True,
          alternative=("fsdp", "off"),
          verdicts={"communication-bound": 1, "memory-bound": 1},
          risk="checkpoints are partitioned (DeepSpeed's zero_to_fp32.py consolidates them)",
          adapters=frozenset({"hf", "lightning", "deepspeed"}), memory="states", stage="engine", engine="deepspeed",
          runs_on="deepspeed", states=f"{STATES}:zero_states",
          proven=True,
          refused_under={"lightning": lambda m: [] if m.cuda else [
              (stage, "Lightning's DeepSpeed strategy runs only on CUDA GPUs (its own check, "
                      "lightning.pytorch.strategies.DeepSpeedStrategy.setup_environment)", 0) for stage in (1, 2, 3)]},
          apply=f"{ENGINES}.deepspeed_engine:DeepSpeedEngine",
          exports={"ds_config.json": "zero_optimization.stage", "accelerate_config.yaml": "distributed_type",
                   "lightning_trainer.yaml": "trainer.strategy"}),
    Lever("fsdp", str, "off", "FSDP2 fully_shard per block and on the root",
          choices=("off", "full_shard", "shard_grad_op"), aliases=((False, "off"),), group="sharding",
          needs=lambda k, w: k["zero_stage"] == 0, conflict=_fsdp_conflict, alternative=("zero_stage", 0),
          refused=lambda m: [] if m.fsdp2 else [
              (mode, "this PyTorch has no torch.distributed.fsdp.fully_shard (FSDP2 needs torch >= 2.6)", "off")
              for mode in ("full_shard", "shard_grad_op")],
          path=90, walk=40, reference="off", verdicts={"communication-bound": 2, "memory-bound": 0},
          risk="parameters are DTensors: save with torch.distributed.checkpoint (DCP), not a plain state_dict",
          label="fsdp={}", memory="states", stage="engine", apply=f"{ENGINES}.data_parallel:shard", engine="fsdp",
          runs_on="torch", states=f"{STATES}:sharded_states",
          proven=True,
          suggest=(("off", "shard_grad_op"), "fsdp: shard_grad_op (one all-gather fewer per block)"),
          exports={"accelerate_config.yaml": "fsdp_config", "hf_training_args.json": "fsdp / fsdp_config",
                   "torchtitan.toml": "data_parallel_shard_degree", "lightning_trainer.yaml": "trainer.strategy"},
          export_with="tuner.inputs.exports.parallel:fsdp_exports"),
    Lever("activation_checkpointing", str, "none",
          "recompute activations in the backward: every block's whole forward (full), every other block's "
          "(selective), or each block's cheap operators, its matmul and attention outputs kept (op)",
          choices=("none", "op", "selective", "full"), aliases=((False, "none"), (None, "none")), group="model",
          path=60, walk=50, ordered=True, reference="none", verdicts={"memory-bound": 2},
          risk="recompute: the backward re-runs the checkpointed blocks' forwards (RNG state is replayed, so "
               "dropout matches)",
          label="ac={}", adapters=frozenset({"hf"}), memory="activations", frees_activations=("selective", "full"),
          proven=True,
          prior={"none": 1.0, "op": 0.6, "selective": 0.5, "full": 0.1}, stage="model",
          apply=f"{ENGINES}.model_levers:checkpointing",
          exports={"hf_training_args.json": "activation_checkpointing", "torchtitan.toml": "activation_checkpoint",
                   "accelerate_config.yaml": "fsdp_config.fsdp_activation_checkpointing",
                   "torch_settings.py": "op_context (op)"},
          export_with="tuner.inputs.exports.checkpointing:checkpointing_exports"),
    Lever("compile", bool, False, "torch.compile of each block (or the model)", group="kernels", path=110, walk=60,
          reference=False, verdicts={"host-cpu-saturated": 2, "host-bound": 1, "compute-bound": 1},
          suggest=((True,), "compile: true (fused kernels)"),
          refused=lambda m: [] if m.compiler else [
              (True, "torch.compile's inductor needs "
                     f"{m.compiler_missing or 'a C++ compiler on the PATH (g++ or clang++) for CPU code'}, and this "
                     "machine has none", False)],
          risk="compile time at start-up and on every new shape (variable sequence lengths recompile); checked by "
               "the precision guard",
          label="compile", adapters=frozenset({"hf"}), stage="model", apply=f"{ENGINES}.model_levers:compiling",
          exports={"accelerate_config.yaml": "dynamo_config", "hf_training_args.json": "torch_compile",
                   "torchtitan.toml": "compile"}, export_with="tuner.inputs.levers_gpu:compile_exports"),
    Lever("ddp_bucket_cap_mb", int, 25, "DDP gradient bucket size, MiB (DDP only)", minimum=1,
          group="communication", needs=lambda k, w: w > 1 and k["zero_stage"] == 0 and k["fsdp"] == "off"
          and _data_parallel_only(k, w),
          path=130, walk=120, ordered=True, verdicts={"communication-bound": 3},
          risk="larger buckets start all-reducing later in the backward", label="bucket={}MB",
          adapters=frozenset({"hf"}), stage="engine", apply=f"{ENGINES}.data_parallel:ddp",
          exports={"hf_training_args.json": "ddp_bucket_cap_mb",
                   "torch_settings.py": "model = DistributedDataParallel(model, bucket_cap_mb={!r})"}),
    Lever("overlap_comm", bool, False, "DeepSpeed: overlap gradient reduction with the backward (ZeRO >= 1)",
          group="communication", needs=_zero, path=140, walk=130, verdicts={"communication-bound": 4},
          risk="DeepSpeed holds extra buffers for the overlapped reduction (about 4.5x reduce_bucket_size)",
          label="overlap", adapters=frozenset({"hf", "deepspeed"}), stage="engine",
          apply="tuner.inputs.export:ds_config",
          exports={"ds_config.json": "zero_optimization.overlap_comm"}),
    Lever("reduce_bucket_size", int, DEEPSPEED_BUCKET, "DeepSpeed: elements reduced at once (ZeRO >= 1)",
          minimum=1, group="communication", needs=_zero, path=150, walk=140, ordered=True,
          verdicts={"communication-bound": 5},
          risk="larger buckets: more memory for the reduction, fewer and larger collectives", label="reduce={:.0e}",
          adapters=frozenset({"hf", "deepspeed"}), stage="engine", apply="tuner.inputs.export:ds_config",
          exports={"ds_config.json": "zero_optimization.reduce_bucket_size"}),
    Lever("allgather_bucket_size", int, DEEPSPEED_BUCKET, "DeepSpeed: elements all-gathered at once (ZeRO 1-2)",
          minimum=1, group="communication", needs=lambda k, w: k["zero_stage"] in (1, 2),  # ZeRO-3 prefetches
          path=160, walk=150, ordered=True, verdicts={"communication-bound": 6},
          risk="larger buckets: more memory for the gathered parameters, fewer collectives", label="gather={:.0e}",
          adapters=frozenset({"hf", "deepspeed"}), stage="engine", apply="tuner.inputs.export:ds_config",
          exports={"ds_config.json": "zero_optimization.allgather_bucket_size"}),
    Lever("offload_optimizer", str, "none", "optimizer states (and step) on the host (ZeRO >= 1 or FSDP2)",
          choices=("none", "cpu"), aliases=((False, "none"), (None, "none")), group="sharding",
          needs=lambda k, w: (k["zero_stage"] >= 1 or k["fsdp"] != "off") and _data_parallel_only(k, w),
          conflict=_offload_conflict,
          path=100, walk=160, verdicts={"memory-bound": 3},
          risk="host memory and PCIe traffic: the optimizer state and step live on the CPU", label="offload={}",
          adapters=frozenset({"hf", "deepspeed"}), memory="states", stage="engine",
          apply="tuner.inputs.export:ds_config", states=f"{STATES}:offloaded_states",
          proven=True,
          exports={"ds_config.json": "zero_optimization.offload_optimizer"}),
    Lever("optimizer_impl", str, "default", "torch.optim implementation", choices=("default", "foreach", "fused"),
          group="optimizer", path=120, walk=110, verdicts={"host-bound": 2, "compute-bound": 4},
          suggest=(("fused",), "optimizer_impl: fused"),
          risk="fused kernels exist for AdamW/Adam/SGD on CUDA and CPU; a custom optimizer keeps its own",
          label="opt={}", adapters=frozenset({"hf"}), stage="optimizer", apply=f"{ENGINES}.model_levers:apply_impl",
          exports={"hf_training_args.json": "optim", "torchtitan.toml": "optimizer.implementation"}),
    Lever("matmul_precision", str, "highest", "torch.set_float32_matmul_precision: TF32 matmuls on NVIDIA GPUs",
          choices=("highest", "high", "medium"), group="kernels", refused=_matmul_refused, ordered=True,
          path=55, walk=15, reference="highest", verdicts={"compute-bound": 0},
          suggest=(("high", "medium"), "matmul_precision: high (TF32 for what runs in fp32)"),
          risk="numerics: fp32 matmuls round their inputs to TF32 (10-bit mantissa; medium: bf16); checked by the "
               "precision guard",
          label="matmul={}", adapters=ALL, stage="process", apply=f"{ENGINES}.process:matmul_precision",
          exports={"hf_training_args.json": "tf32",
                   "torch_settings.py": "torch.set_float32_matmul_precision({!r})"}),
    Lever("channels_last", bool, False, "channels-last memory format for the model and its 4-D inputs",
          group="model", path=115, walk=65, verdicts={"compute-bound": 5},
          suggest=((True,), "channels_last: true (convolutional models)"), acts_on="convolutions",
          risk="custom kernels or reshapes that assume NCHW-contiguous tensors copy (or break); only convolutional "
               "models gain",
          label="channels_last", stage="model", apply=f"{ENGINES}.model_levers:memory_format",
          exports={"torch_settings.py": "model = model.to(memory_format=torch.channels_last)  # and each image "
                                        "batch: x.to(memory_format=torch.channels_last)"}),
    Lever("cudnn_benchmark", bool, False, "cuDNN times its convolution algorithms and keeps the fastest",
          group="kernels", path=116, walk=66, verdicts={"compute-bound": 6},
          suggest=((True,), "cudnn_benchmark: true (convolutions of fixed shapes)"), acts_on="convolutions",
          refused=lambda m: [] if m.cudnn else [
              (True, "cuDNN's algorithm search needs a CUDA device with cuDNN", False)],
          risk="the first step of every new input shape times each algorithm (variable shapes pay it again); the "
               "fastest algorithm may not be deterministic",
          label="cudnn_benchmark", adapters=ALL, stage="process", apply=f"{ENGINES}.process:cudnn_benchmark",
          exports={"torch_settings.py": "torch.backends.cudnn.benchmark = {!r}"}),
    Lever("in_order", bool, True, "DataLoader in_order: false hands batches over as workers finish them",
          group="loader", needs=_workers, path=45, walk=105, verdicts={"data-bound": 4},
          refused=lambda m: [] if m.in_order else [
              (False, "this PyTorch's DataLoader has no in_order (needs torch >= 2.6)", True)],
          risk="batch order varies run to run (the same batches each epoch): not for order-sensitive training",
          label="out_of_order", adapters=REBUILT, stage="loader", apply="tuner.trial.data:make_loader",
          loader_kwarg="in_order", kwarg_at_default=False, exports={"dataloader.json": "in_order"}),
    *GPU_LEVERS,
)}
"""Every lever, in declaration order."""


ENGINE_ORDER = ("layout", "fsdp", "deepspeed")
"""Which engine label a configuration takes where its levers give several (a layout shards
its data-parallel dimension with FSDP2 inside the layout)."""
ENGINE_NAMES = {"torch": "PyTorch's engine", "deepspeed": "DeepSpeed"}
"""The recipe's ``engine`` values, in words."""


def engine_of(values: Mapping[str, Any], asked: str = "auto") -> str:
    """The engine label of these knob values (every lever's, after the levers that mean
    nothing took their defaults); ``asked``: the recipe's ``engine``."""
    moved = {lever.engine for name, lever in LEVERS.items()
             if lever.engine and values.get(name, lever.default) != lever.default}
    return next((e for e in ENGINE_ORDER if e in moved), "deepspeed" if asked == "deepspeed" else "torch")


def engine_clash(values: Mapping[str, tuple[Any, ...]], asked: str) -> str | None:
    """Why lever values (each lever's possible values) cannot run on the engine the recipe
    names (``None``: they can, or the recipe says ``auto``)."""
    if asked == "auto":
        return None
    for name, lever in LEVERS.items():
        others = [v for v in values.get(name, ()) if v != lever.default]
        if lever.runs_on and lever.runs_on != asked and others:
            return (f"engine: {asked} cannot run {name} {', '.join(map(str, others))}, which "
                    f"{ENGINE_NAMES[lever.runs_on]} runs; use engine: auto, or {name}: {lever.default}")
    return None


def recomputing() -> tuple[str, ...]:
    """The levers that trade recompute for activation memory (``Lever.frees_activations``)."""
    return tuple(name for name, lever in LEVERS.items() if lever.frees_activations)


def sharded_engines() -> frozenset[str]:
    """The engine labels of the sharding levers (their collectives overlap the step)."""
    return frozenset(lever.engine for lever in LEVERS.values() if lever.group == "sharding" and lever.engine)


def loader_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    """The DataLoader keywords of the loader levers in ``values`` (every loader lever, by
    name): each that means something given the others (``prefetch_factor`` only with
    workers, which the DataLoader enforces), one only recent DataLoaders take only away
    from its default."""
    return {lever.loader_kwarg: values[name] for name, lever in LEVERS.items()
            if lever.group == "loader" and lever.loader_kwarg and lever.needs(values, 1)
            and (lever.kwarg_at_default or values[name] != lever.default)}


def of(group: str) -> tuple[str, ...]:
    """The levers of one group, in declaration order."""
    return tuple(name for name, lever in LEVERS.items() if lever.group == group)


def by(attribute: str) -> tuple[str, ...]:
    """The levers in the order of one of their ranks (``path``, ``walk``)."""
    return tuple(sorted(LEVERS, key=lambda name: getattr(LEVERS[name], attribute)))


def proven(step: str) -> bool:
    """Whether an attribution step (``zero_stage``, ``zero_stage+fsdp``) holds a lever that
    stays in an answer only on evidence of a gain (:attr:`Lever.proven`)."""
    return any(LEVERS[k].proven for k in step.split("+") if k in LEVERS)


def with_memory(effect: str) -> tuple[str, ...]:
    return tuple(name for name, lever in LEVERS.items() if lever.memory == effect)


def pointed_at(verdict: str) -> tuple[str, ...]:
    """The levers a verdict points at, its first choice first."""
    ranked = [(lever.verdicts[verdict], name) for name, lever in LEVERS.items() if verdict in lever.verdicts]
    return tuple(name for _, name in sorted(ranked))


def verdict_kinds() -> tuple[str, ...]:
    return tuple(dict.fromkeys(kind for lever in LEVERS.values() for kind in lever.verdicts))
