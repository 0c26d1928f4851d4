"""The layout's levers: tensor and pipeline parallel degrees, the pipeline's schedule,
sequence parallelism. One function applies them all (the layout's ``parallelize``), and
:class:`tuner.inputs.layout.Layout` is their arithmetic.
"""

from __future__ import annotations

from tuner.inputs.lever import Applied, Exported, Lever, MemoryTerm

DECLARED: tuple[Lever, ...] = (
    Lever("tensor_parallel", "ranks one layer's matmuls are split over (DTensor colwise/rowwise)", minimum=1,
          group="layout", ordered=True, label="tp={}",
          risk="every block all-reduces its activations across the tensor-parallel group: keep it inside a node",
          engine="layout",
          applied=Applied("engine"),
          exported=Exported({"torchtitan.toml": "parallelism.tensor_parallel_degree",
                             "accelerate_config.yaml": "parallelism_config.parallelism_config_tp_size",
                             "lightning_trainer.yaml": "trainer.strategy (ModelParallelStrategy "
                                                       "tensor_parallel_size)"}),
          memory=MemoryTerm("states")),
    Lever("pipeline_parallel", "pipeline stages the model's blocks are cut into", minimum=1, group="layout",
          ordered=True, label="pp={}",
          risk="the pipeline bubble: stages idle while the first micro-batches fill it", engine="layout",
          applied=Applied("engine"),
          exported=Exported({"torchtitan.toml": "parallelism.pipeline_parallel_degree",
                             "accelerate_config.yaml": "comment: Accelerate has no pipeline parallelism",
                             "lightning_trainer.yaml": "comment: Lightning has no pipeline parallelism"}),
          memory=MemoryTerm("states")),
    Lever("pipeline_schedule", "how micro-batches flow through the stages",
          group="layout",
          label="{}",
          suggest=(("interleaved_1f1b",), "pipeline_schedule: interleaved_1f1b "
                                                                          "(two stages per rank: half the bubble)"),
          risk="gpipe holds every micro-batch's activations at once; interleaved halves the bubble for twice "
               "the stage-to-stage sends",
          applied=Applied("engine"),
          exported=Exported({"torchtitan.toml": "parallelism.pipeline_parallel_schedule"}),
          memory=MemoryTerm("activations", prior={"1f1b": 1.0, "gpipe": 1.0, "interleaved_1f1b": 1.0})),
    Lever("sequence_parallel", "norms and residual stream sharded over the sequence (tensor_parallel)",
          group="layout", label="sp",
          risk="a reduce-scatter and an all-gather per region instead of one all-reduce; the sequence length must "
               "divide by tensor_parallel",
          applied=Applied("engine"),
          exported=Exported({"torchtitan.toml": "comment: torchtitan shards the sequence with every "
                                                "tensor_parallel_degree"}),
          memory=MemoryTerm("activations", prior={False: 1.0, True: 1.0})),
)
